"""Node loss on the real dev Slurm cluster (3 nodes + 1 spare), the Slurm backend's part of the
heal: drain (quarantine) → fence every step (the lost node's: set DOWN since it cannot confirm)
→ launch every rank at the new epoch, the lost one on the spare; and, in the same run, when
Slurm itself marked the node not responding.

    .venv/bin/python -m bench.bench_slurm_node_loss

Timeouts set (dev cluster's slurm.conf): SlurmdTimeout=10, MessageTimeout=5, KillWait=5; the
job's fencing grace 1 s. The ranks are ``sleep`` steps: detect, decide, rendezvous, restore and
first step are not measured here (no node-silence verdict and no agents on the nodes yet).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from trainguard.actuators.jobspec import JobSpec, UnitSpec
from trainguard.actuators.slurm import SlurmBackend
from trainguard.actuators.slurm_cli import SlurmCli
from trainguard.dev.slurm import NETNS_PREFIX, ClusterSpec, SlurmCluster

NODES = ("tgn1", "tgn2", "tgn3", "tgn4")


def lose(name: str, veth: str) -> None:
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    for pid in subprocess.run(["ip", "netns", "pids", NETNS_PREFIX + name], capture_output=True,
                              text=True, check=True).stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def main() -> None:
    root = Path(tempfile.mkdtemp(prefix="tg-bench-slurm-"))
    cluster = SlurmCluster(root / "cluster")
    t_start = time.monotonic()
    info = cluster.start(ClusterSpec(nodes=3, spares=1), timeout_s=60)
    print(f"cluster start: {time.monotonic() - t_start:.1f} s")
    env = cluster.client_env()
    cli = SlurmCli(env)
    try:
        out = subprocess.run(["sbatch", "--parsable", "--no-kill", "-N4", "-w", ",".join(NODES),
                              "-o", "/dev/null", "--wrap", "sleep 900"], env=env,
                             capture_output=True, text=True, check=True).stdout
        alloc = int(out.strip().split(";")[0])
        while (j := cli.job(alloc)) is None or j.state != "RUNNING":
            time.sleep(0.2)
        job = JobSpec(job_id="bench", world_size=3, command=("sleep", "900"),
                      units=tuple(UnitSpec(n, (), i if i < 3 else None)
                                  for i, n in enumerate(NODES)),
                      ckpt_dir=Path(info.shared_dir), grace_s=1.0, log_dir=root / "logs")
        be = SlurmBackend(cli, alloc, root)
        reps = [be.launch(job, job.unit(n), i, 1, 0) for i, n in enumerate(NODES[:3])]
        lose("tgn2", "tgsv2")
        t0 = time.monotonic()
        be.quarantine(job, "tgn2", "trainguard bench-cmd verdicts v-node-tgn2")
        t1 = time.monotonic()
        for r in reps:
            be.fence(job, r)
        t2 = time.monotonic()
        placement = {0: "tgn1", 1: "tgn4", 2: "tgn3"}
        for rank, node in placement.items():
            be.launch(job, job.unit(node), rank, 2, 0)
        t3 = time.monotonic()
        live = sorted((r.rank, r.unit, r.epoch) for r in be.live(job))
        assert live == [(0, "tgn1", 2), (1, "tgn4", 2), (2, "tgn3", 2)], live
        # when Slurm alone notices: the node flagged NOT_RESPONDING by slurmctld
        noticed = None
        while time.monotonic() < t0 + 60:
            lost = {n.name: n for n in cli.nodes()}["tgn2"]
            if "NOT_RESPONDING" in lost.flags:
                noticed = time.monotonic() - t0
                break
            time.sleep(0.5)
        print(f"drain (scontrol update State=DRAIN): {t1 - t0:6.2f} s")
        print(f"fence 3 steps (lost node: cancel fails, DOWN, given up): {t2 - t1:6.2f} s")
        print(f"launch 3 steps at epoch 2 (srun, listed by scontrol): {t3 - t2:6.2f} s")
        print(f"backend total, node loss -> ranks running on the spare: {t3 - t0:6.2f} s")
        print("Slurm itself flagged tgn2 NOT_RESPONDING: "
              + (f"{noticed:.1f} s after the loss" if noticed is not None else "not within 60 s"))
        for r in be.live(job):
            be.fence(job, r)
        subprocess.run(["scancel", str(alloc)], env=env, check=False)
    finally:
        subprocess.run(["ip", "link", "set", "tgsv2", "up"], check=False)
        cluster.stop()


if __name__ == "__main__":
    main()
