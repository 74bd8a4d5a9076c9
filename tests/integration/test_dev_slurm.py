"""The dev Slurm cluster is real: munge, slurmctld and one slurmd per network-namespace node.

One cluster for the module (start ~2 s, plus its broker for the nodes' agents); the tests run
real ``srun`` steps across the nodes, check that every node's agent publishes from inside its
namespace (its telemetry, and its ranks' step reports through its own step socket), take a node
away as a lost node goes (link down, slurmd and agent killed) and check that Slurm itself marks
it down, restart after a crash, and tear down without leftovers.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import read_events
from trainguard.bus.config import KafkaConfig
from trainguard.dev.procs import alive
from trainguard.dev.slurm import (
    BRIDGE,
    NETNS_PREFIX,
    AgentPlan,
    ClusterInfo,
    ClusterSpec,
    SlurmCluster,
    _netns_list,
    torchrun_argv,
)
from trainguard.events.payloads import NodeTelemetry, StepReport
from trainguard.events.topics import TopicRole

pytestmark = pytest.mark.integration

SPEC = ClusterSpec(nodes=2, spares=1)
PREFIX = "tgslurm"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start(SPEC, timeout_s=60, agents=AgentPlan(prefix=PREFIX))
    except Exception as exc:
        c.stop()
        pytest.fail(f"the dev Slurm cluster could not start: {exc}", pytrace=False)
    try:
        yield c
    finally:
        c.stop()


def srun(c: SlurmCluster, *argv: str, timeout_s: float = 60) -> str:
    done = subprocess.run(["srun", *argv], env=c.client_env(), capture_output=True, text=True,
                          timeout=timeout_s)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_steps_run_on_every_node_in_its_own_namespace(cluster: SlurmCluster) -> None:
    info = cluster.info()
    assert info is not None
    out = srun(cluster, "-N3", "bash", "-c",
               "echo $SLURMD_NODENAME $(ip -o -4 addr show eth0 | awk '{print $4}') "
               f"> {info.shared_dir}/$SLURMD_NODENAME; cat {info.shared_dir}/$SLURMD_NODENAME")
    seen = dict(line.split() for line in out.splitlines())
    assert seen == {n.name: f"{n.address}/24" for n in info.nodes}
    # The shared directory (the job's reliable storage) is the same for every node.
    assert sorted(p.name for p in Path(info.shared_dir).iterdir()) == SPEC.names
    assert [n.name for n in info.nodes if n.spare] == ["tgn3"]


REPORT = """
import os, sys
from trainguard_sdk.reporter import StepReporter
rank = int(os.environ["SLURM_PROCID"])
with StepReporter("j-slurm", rank, int(os.environ["SLURM_NTASKS"]),
                  heartbeat_interval_s=None) as tg:
    assert tg.step(1, 32, 5.0), "the node's agent did not take the report"
"""


def test_every_node_runs_its_agent_and_its_records_arrive(cluster: SlurmCluster) -> None:
    """One agent per node, inside the node's namespace, publishing to the head's broker on the
    bridge: each node's telemetry arrives under its name, and a rank on each node reports
    through its own node's step socket (located at that node)."""
    info = cluster.info()
    assert info is not None and info.agents_bootstrap is not None
    assert info.agents_bootstrap.startswith(f"{info.head_address}:")
    pids = {n.name: cluster.agent_pid(n.name) for n in info.nodes}
    assert all(pids.values()) and len(set(pids.values())) == len(pids), pids
    for n in info.nodes:  # each agent runs in its node's namespace
        inside = subprocess.run(["ip", "netns", "pids", n.netns], capture_output=True,
                                text=True, check=True).stdout.split()
        assert str(pids[n.name]) in inside, n.name
    script = Path(info.shared_dir) / "report.py"
    script.write_text(REPORT)
    # quoted: the clone's path may hold a space; the node name expands on each node
    sock = f'{shlex.quote(str(cluster.root))}/agents/"$SLURMD_NODENAME"/agent.sock'
    srun(cluster, "-N3", "bash", "-c", f"TRAINGUARD_AGENT_SOCKET={sock} exec "
         f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}")
    broker = cluster.broker.running()
    assert broker is not None
    kafka = KafkaConfig(bootstrap=broker.bootstrap, topic_prefix=PREFIX,
                        client_id="test-dev-slurm")
    deadline = time.monotonic() + 30
    while True:
        events = read_events(kafka, [TopicRole.TELEMETRY, TopicRole.TASK], idle_ms=1500)
        telemetry = {e.subject.node for e in events if isinstance(e.payload, NodeTelemetry)
                     and e.source == f"agent@{e.subject.node}"}
        steps = {(e.payload.rank, e.subject.node) for e in events
                 if isinstance(e.payload, StepReport) and e.job_id == "j-slurm"}
        names = {n.name for n in info.nodes}
        if (telemetry == names and len(steps) == 3) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert telemetry == names
    # every rank's report came through the agent of the node it ran on, one rank per node
    assert {node for _, node in steps} == names and {r for r, _ in steps} == {0, 1, 2}


TRAIN = """
import os, sys, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
row = (os.environ["SLURMD_NODENAME"], os.environ["GROUP_RANK"], dist.get_rank(),
       dist.get_world_size(), int(t.item()))
with open(os.path.join(sys.argv[1], "rank-%d" % dist.get_rank()), "w") as f:
    f.write(" ".join(map(str, row)))
dist.destroy_process_group()
"""


def test_a_torchrun_job_spans_the_nodes(cluster: SlurmCluster) -> None:
    """One torchrun agent per node under srun, c10d rendezvous at the head's store, gloo over
    the namespaces' network: 3 nodes x 2 ranks all-reduce their ranks."""
    info = cluster.info()
    assert info is not None
    script = Path(info.shared_dir) / "allreduce.py"
    script.write_text(TRAIN)
    results = Path(info.shared_dir) / "ranks"
    results.mkdir(exist_ok=True)
    argv = torchrun_argv(info.rdzv_endpoint, nnodes=3, nproc_per_node=2, run_id="t1",
                         script=[str(script), str(results)])
    srun(cluster, "-N3", "-w", "tgn1,tgn2,tgn3", *argv, timeout_s=120)
    # each rank writes its row to the shared directory (srun interleaves the tasks' stdout)
    rows = [p.read_text().split() for p in sorted(results.iterdir())]
    assert sorted(int(r[2]) for r in rows) == list(range(6))
    assert {r[4] for r in rows} == {"15"}  # 0+1+...+5 on every rank
    # Each node's agent is one group rank; its two ranks run on that node.
    by_node = {(r[0], r[1]) for r in rows}
    assert len(by_node) == 3 and {n for n, _ in by_node} == {"tgn1", "tgn2", "tgn3"}


def test_start_again_keeps_the_running_cluster(cluster: SlurmCluster) -> None:
    before = cluster.info()
    assert before is not None
    again = cluster.start(SPEC)
    assert again.ctld_pid == before.ctld_pid


def test_a_lost_node_is_marked_down_by_slurm(cluster: SlurmCluster) -> None:
    # A node lost as nodes go: its link down and its slurmd gone.
    subprocess.run(["ip", "link", "set", "tgsv2", "down"], check=True)
    pids = subprocess.run(["ip", "netns", "pids", NETNS_PREFIX + "tgn2"], capture_output=True,
                          text=True, check=True).stdout.split()
    for pid in pids:
        os.kill(int(pid), signal.SIGKILL)
    states = cluster.wait_nodes(["tgn2"], {"down"}, timeout_s=60)
    assert states["tgn1"].startswith("idle") and states["tgn3"].startswith("idle")
    assert cluster.agent_pid("tgn2") is None  # the node's agent went with it
    # Back: link up, slurmd (and the agent) started again -> the node returns to service.
    subprocess.run(["ip", "link", "set", "tgsv2", "up"], check=True)
    cluster.start_node("tgn2")
    assert cluster.agent_pid("tgn2") is not None
    cluster.wait_nodes(["tgn2"], {"idle"}, timeout_s=60)


def test_start_after_a_crash_sweeps_and_restarts(cluster: SlurmCluster) -> None:
    info = cluster.info()
    assert info is not None
    os.kill(info.ctld_pid, signal.SIGKILL)  # the controller crashes...
    for n in info.nodes:                      # ...and every slurmd with it
        for pid in subprocess.run(["ip", "netns", "pids", n.netns], capture_output=True,
                                  text=True).stdout.split():
            os.kill(int(pid), signal.SIGKILL)
    assert cluster.running() is None
    again: ClusterInfo = cluster.start(SPEC, timeout_s=60)
    assert again.ctld_pid != info.ctld_pid
    assert "tgn1" in srun(cluster, "-N1", "-w", "tgn1", "printenv", "SLURMD_NODENAME")


def test_the_backend_cli_drains_cancels_and_confirms(cluster: SlurmCluster) -> None:
    """What the Slurm backend does to fence a node's step, on the real cluster: drain with the
    incident as reason, cancel the step, confirm it gone; the pool from Slurm's own view."""
    from trainguard.actuators.slurm_cli import SlurmCli
    from trainguard.actuators.slurm_view import NodeHealth, pool

    if cluster.running() is None:  # an earlier test stopped or crashed it
        cluster.start(SPEC, timeout_s=60)
    cli = SlurmCli(cluster.client_env())
    done = subprocess.run(["sbatch", "--parsable", "-N2", "-w", "tgn1,tgn2", "-o", "/dev/null",
                           "--wrap", "srun sleep 300"], env=cluster.client_env(),
                          capture_output=True, text=True, check=True)
    job_id = int(done.stdout.strip().split(";")[0])
    step = f"{job_id}.0"
    deadline = time.monotonic() + 30
    while not any(s.step_id == step and s.state == "RUNNING" for s in cli.steps()):
        assert time.monotonic() < deadline, cli.steps()
        time.sleep(0.2)
    job = cli.job(job_id)
    assert job is not None and job.nodes == ("tgn1", "tgn2")
    assert [n.name for n in pool(cli.nodes(), job).spares] == ["tgn3"]
    cli.drain("tgn2", "trainguard incident inc-7 (node_lost)")
    cli.cancel_step(step)
    assert cli.confirm_gone(step, timeout_s=30)
    nodes = {n.name: n for n in cli.nodes()}
    assert nodes["tgn2"].health is NodeHealth.DRAINING
    assert nodes["tgn2"].reason == "trainguard incident inc-7 (node_lost)"
    assert pool(cli.nodes(), job).lost == ("tgn2",)
    cli.resume("tgn2")
    subprocess.run(["scancel", str(job_id)], env=cluster.client_env(), check=True)
    assert cluster.wait_nodes(["tgn2"], {"idle"}, timeout_s=30)


def test_stop_leaves_nothing(tmp_path: Path, cluster: SlurmCluster) -> None:
    # Runs last in the module: the fixture's teardown then finds nothing to stop.
    agents = [cluster.agent_pid(n) for n in SPEC.names]
    assert cluster.stop() is True
    assert not [p for p in agents if p is not None and alive(p)]
    assert not list((cluster.root / "agents").glob("*/agent.pid"))
    assert cluster.broker.running() is None
    assert not [ns for ns in _netns_list() if ns.startswith(NETNS_PREFIX)]
    assert subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0
    for daemon in ("slurmctld", "slurmd", "munged"):
        pids = subprocess.run(["pgrep", "-x", daemon], capture_output=True,
                              text=True).stdout.split()
        assert not [p for p in pids if alive(int(p))], daemon  # zombies awaiting reap are gone
    assert cluster.stop() is False
