"""What torchrun alone does with a lost node, run for real on the dev Slurm cluster (3 nodes +
1 spare, no trainguard loop): the reference workload as a torchrun job, one agent per node
under ``srun -N3 --no-kill`` (c10d rendezvous at the head's store, ``--nnodes 3``,
``--max-restarts 3``, one worker per node, gloo timeout 20 s), tgn2 lost as in the drills
(link down, every process of its namespace killed). Printed, in seconds since the loss: when
the survivors' workers ended, whether any step came after the loss, and when the agents gave
up. A round waits ``join_timeout`` for its nodes: ``--join-timeout-s`` (60 here, to keep the
run short; torchrun's default is 600). The spare is idle in the cluster and nothing brings it
in. ``bench.bench_slurm_drill`` measures the same loss healed by the loop.

    .venv/bin/python -m bench.bench_torchrun_alone [--join-timeout-s 60]   (root)
"""

from __future__ import annotations

import argparse
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from trainguard.dev.slurm import ClusterSpec, SlurmCluster, torchrun_argv
from trainguard.workload.progress import read_progress

NODES = "tgn1,tgn2,tgn3"


def lines(path: Path) -> list[dict[str, Any]]:
    return read_progress(path) if path.exists() else []


def run(join_s: float) -> None:
    cluster = SlurmCluster()
    cluster.stop()
    info = cluster.start(ClusterSpec(nodes=3, spares=1), timeout_s=90)
    try:
        tag = uuid.uuid4().hex[:8]
        root = Path(info.shared_dir) / f"alone-{tag}"
        (root / "ckpt").mkdir(parents=True)
        progress = root / "progress.jsonl"  # every rank appends its lines (each names its rank)
        script = ["-m", "trainguard.workload.ddp", "--ckpt-dir", str(root / "ckpt"),
                  "--steps", "100000", "--ckpt-every", "10", "--step-ms", "50",
                  "--timeout-s", "20", "--cpu", "--progress-file", str(progress)]
        argv = torchrun_argv(info.rdzv_endpoint, nnodes=3, nproc_per_node=1,
                             run_id=f"alone-{tag}", script=script, max_restarts=3,
                             rdzv_conf=f"join_timeout={join_s:g}")
        env = {**cluster.client_env(), "OMP_NUM_THREADS": "1"}
        with open(root / "srun.log", "wb") as out:
            srun = subprocess.Popen(["srun", "-N3", "-w", NODES, "--no-kill", *argv], env=env,
                                    stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 180
        while not any(ln["kind"] == "checkpoint" and ln["step"] >= 20
                      for ln in lines(progress)):
            if srun.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the job never got going: see {root}/srun.log")
            time.sleep(0.5)
        before = max(ln["step"] for ln in lines(progress) if ln["kind"] == "step")
        t0 = time.time()
        cluster.power_off("tgn2")
        deadline = time.monotonic() + join_s + 180
        while srun.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        ended = time.time() - t0
        if srun.poll() is None:
            srun.kill()
        got = lines(progress)
        after = [ln for ln in got if ln["kind"] == "step" and ln["time"] > t0]
        exits = sorted((ln["time"] - t0, ln["rank"], ln["code"]) for ln in got
                       if ln["kind"] == "exit" and ln["time"] > t0)
        starts = [ln for ln in got if ln["kind"] == "start" and ln["time"] > t0]
        print(f"tgn2 lost at step {before}; {len(after)} step(s) after the loss by any rank")
        for t, rank, code in exits:
            print(f"  +{t:.1f} s: a worker (group rank {rank}) exited {code}")
        print(f"  worker starts after the loss (agents' restarts): {len(starts)}")
        how = (f"ended, exit {srun.returncode}" if srun.returncode is not None
               else "still running: killed")
        print(f"  +{ended:.1f} s: the job's srun {how} (join_timeout {join_s:g} s; torchrun's "
              "default 600 s); the spare tgn4 was never brought in")
    finally:
        cluster.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--join-timeout-s", type=float, default=60.0)
    run(ap.parse_args().join_timeout_s)


if __name__ == "__main__":
    main()
