"""The ``slurm`` actuator backend on the real dev cluster: replicas are job steps of one
allocation (2 nodes + 1 spare, ``--no-kill``), launched with srun, proven live by the journal
joined with ``scontrol show step``, fenced by step id and epoch. A node lost as nodes go (link
down, every process of its namespace killed): its step is fenced (its node set DOWN since it
cannot confirm a cancel), the node drained with the incident as reason, the rank relaunched on
the spare at a new epoch; a stale report of the old epoch finds its step gone. An elastic job
(torchrun, one agent per node) loses a node: only that node's step is replaced, the survivor's
agent restarts its worker into the new rendezvous round, and both resume from the checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests import keys
from trainguard.actuators.jobspec import JobSpec, UnitSpec
from trainguard.actuators.service import Actuator, ActuatorOptions
from trainguard.actuators.slurm import SlurmBackend
from trainguard.actuators.slurm_cli import SlurmCli
from trainguard.actuators.slurm_view import NodeHealth, SlurmJob
from trainguard.bus.memory import MemoryBus
from trainguard.dev.slurm import (
    NETNS_PREFIX,
    ClusterSpec,
    SlurmCluster,
    power_off,
    torchrun_argv,
)
from trainguard.events.payloads import CommandOutcome, OutcomeStatus
from trainguard.events.topics import TopicRole

pytestmark = pytest.mark.integration

SPEC = ClusterSpec(nodes=2, spares=1)
CKPT_EVERY = 5  # the elastic job's checkpoints


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start(SPEC, timeout_s=60)
    except Exception as exc:
        c.stop()
        pytest.fail(f"the dev Slurm cluster could not start: {exc}", pytrace=False)
    try:
        yield c
    finally:
        subprocess.run(["ip", "link", "set", "tgsv2", "up"], check=False)
        c.stop()


def ended(pid: int, timeout_s: float) -> bool:
    """Dead (or a zombie: killed, its parent not yet reaping) within ``timeout_s``?"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def allocate(cluster: SlurmCluster) -> tuple[SlurmCli, int]:
    """Every node back in service (an earlier test lost some), then an allocation of
    tgn1-tgn3 with --no-kill, running."""
    cli = ready(cluster)
    done = subprocess.run(["sbatch", "--parsable", "--no-kill", "-N3", "-w", "tgn1,tgn2,tgn3",
                           "-o", "/dev/null", "--wrap", "sleep 600"], env=cli.env,
                          capture_output=True, text=True, check=True)
    alloc = int(done.stdout.strip().split(";")[0])
    deadline = time.monotonic() + 30
    while (j := cli.job(alloc)) is None or j.state != "RUNNING":
        assert time.monotonic() < deadline, j
        time.sleep(0.2)
    return cli, alloc


def ready(cluster: SlurmCluster) -> SlurmCli:
    """The cluster running and every node back in service (an earlier test lost some)."""
    if cluster.running() is None:
        cluster.start(SPEC, timeout_s=60)
    env = cluster.client_env()
    cli = SlurmCli(env)
    for i, name in enumerate(("tgn1", "tgn2", "tgn3"), start=1):
        subprocess.run(["scontrol", "update", f"NodeName={name}", "State=RESUME"], env=env,
                       capture_output=True, check=False)
        subprocess.run(["ip", "link", "set", f"tgsv{i}", "up"], check=False)
        if cluster.node_states().get(name, "").startswith(("down", "idle*")):
            cluster.start_node(name)
    cluster.wait_nodes(["tgn1", "tgn2", "tgn3"], {"idle"}, timeout_s=60)
    return cli


def job_none() -> SlurmJob:
    return SlurmJob(0, "", "", ())


def lose_node(name: str, veth: str) -> None:
    power_off(NETNS_PREFIX + name, veth)  # as nodes go: link down, every process killed


def sleep_job(job_id: str, cluster: SlurmCluster, tmp_path: Path) -> JobSpec:
    """Two ranks (tgn1, tgn2) that sleep, tgn3 spare, the cluster's shared checkpoints."""
    info = cluster.info()
    assert info is not None
    return JobSpec(job_id=job_id, world_size=2, command=("sleep", "300"),
                   units=(UnitSpec("tgn1", (), 0), UnitSpec("tgn2", (), 1),
                          UnitSpec("tgn3", ())),
                   ckpt_dir=Path(info.shared_dir), grace_s=1.0, log_dir=tmp_path / "logs")


@contextlib.asynccontextmanager
async def actuator_running(bus: MemoryBus, opts: ActuatorOptions, be: SlurmBackend
                           ) -> AsyncIterator[asyncio.Task[None]]:
    """The actuator service running (it launches the job), every rank a live step; stopped
    on the way out."""
    stop = asyncio.Event()
    task = asyncio.create_task(Actuator(bus, opts, be).run(stop))
    try:
        await until_launched(be, opts.job, task)
        yield task
    finally:
        stop.set()
        await task


def outcomes_on(bus: MemoryBus) -> list[CommandOutcome]:
    return [e.payload for e in bus.events(TopicRole.OUTCOMES)
            if isinstance(e.payload, CommandOutcome)]


async def until_launched(be: SlurmBackend, job: JobSpec, task: asyncio.Task[None],
                         limit_s: float = 60) -> None:
    """Every rank of ``job`` a live step, the actuator (``task``) still running."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while len(await asyncio.to_thread(be.live, job)) < job.world_size:
        assert loop.time() < deadline and not task.done()
        await asyncio.sleep(0.3)


def test_node_loss_fenced_by_step_and_rebound_on_the_spare(cluster: SlurmCluster,
                                                          tmp_path: Path) -> None:
    info = cluster.info()
    assert info is not None
    cli, alloc = allocate(cluster)
    env = cli.env
    try:
        shared = Path(info.shared_dir)
        job = JobSpec(job_id="sj", world_size=2,
                      command=("sh", "-c", f'echo "$SLURMD_NODENAME $TRAINGUARD_RANK '
                               f'$TRAINGUARD_BINDING_EPOCH" > {shared}/r{{rank}}-e{{epoch}}; '
                               "exec sleep 300"),
                      units=(UnitSpec("tgn1", (), 0), UnitSpec("tgn2", (), 1),
                             UnitSpec("tgn3", ())),
                      ckpt_dir=shared, grace_s=1.0)
        be = SlurmBackend(cli, alloc, tmp_path)
        assert [n.name for n in be.pool().allocation] == ["tgn1", "tgn2", "tgn3"]
        r0 = be.launch(job, job.unit("tgn1"), 0, 1, 0)
        r1 = be.launch(job, job.unit("tgn2"), 1, 1, 0)
        assert {(r.rank, r.unit, r.epoch) for r in be.live(job)} == {(0, "tgn1", 1),
                                                                      (1, "tgn2", 1)}
        assert be.epoch(job) == 1
        deadline = time.monotonic() + 30
        while not (shared / "r1-e1").exists():
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert (shared / "r1-e1").read_text().split() == ["tgn2", "1", "1"]
        assert be.unreachable(job, job.unit("tgn3")) is None

        lose_node("tgn2", "tgsv2")
        t0 = time.monotonic()
        rel = be.fence(job, r1)
        fence_s = time.monotonic() - t0
        old = be.step_of(job, 1, 1)
        assert old is not None
        assert be.gone(old.step_id, timeout_s=0)  # the old step gone (or given up by Slurm)
        assert old.step_id not in {(s.step_id) for s in cli.steps()} or \
            "tgn2" not in (cli.job(alloc) or job_none()).nodes
        assert "confirmed gone" in rel.items[0], rel
        be.drain("tgn2", "trainguard incident inc-42 (node lost)")
        nodes = {n.name: n for n in cli.nodes()}
        assert nodes["tgn2"].health is not NodeHealth.USABLE
        assert nodes["tgn2"].reason == "trainguard incident inc-42 (node lost)"
        # Slurm removed the lost node from the allocation (--no-kill: the job goes on)
        assert [n.name for n in be.pool().allocation] == ["tgn1", "tgn3"]

        r1b = be.launch(job, job.unit("tgn3"), 1, 2, 0)
        live = {(r.rank, r.unit, r.epoch) for r in be.live(job)}
        assert live == {(0, "tgn1", 1), (1, "tgn3", 2)}  # no duplicate replica of rank 1
        assert be.stop_stale(job, 1, 1, None) == "already_gone"
        assert be.stop_stale(job, 1, 7, None) == "discarded"  # never started: not touched
        deadline = time.monotonic() + 30
        while not (shared / "r1-e2").exists():
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert (shared / "r1-e2").read_text().split() == ["tgn3", "1", "2"]
        for r in (r0, r1b):
            assert be.fence(job, r).how in ("sigterm", "sigkill")
        assert be.live(job) == []
        print(f"fence of the lost node's step: {fence_s:.1f} s")
    finally:
        subprocess.run(["scancel", str(alloc)], env=env, check=False)


def test_a_signed_migrate_moves_the_lost_nodes_rank_to_the_spare(cluster: SlurmCluster,
                                                                tmp_path: Path) -> None:
    """The actuator service (in-memory bus) with the Slurm backend: it launches the job as
    steps, a node is lost, decide's signed tier-2 MIGRATE of its rank is carried out: the old
    steps fenced by step id, every rank relaunched at a new epoch, the lost rank on the spare."""
    from trainguard.actuators import signing
    from trainguard.events.clock import now_us
    from trainguard.events.codec import make_event
    from trainguard.events.envelope import Subject
    from trainguard.events.payloads import Command, CommandAction, MigrateParams

    cli, alloc = allocate(cluster)
    env = cli.env
    job = sleep_job("sj2", cluster, tmp_path)
    be = SlurmBackend(cli, alloc, tmp_path)
    bus = MemoryBus()
    opts = ActuatorOptions(job=job, key=keys.COMMAND_PUB, signer=keys.ACTUATOR,
                           state_dir=tmp_path / "state", launch=True)

    async def go() -> float:
        loop = asyncio.get_running_loop()
        async with actuator_running(bus, opts, be) as task:
            await asyncio.to_thread(lose_node, "tgn2", "tgsv2")
            t0 = loop.time()
            cmd = Command(command_id="cmd-node-loss", idempotency_key="k-node-loss",
                          action=CommandAction.MIGRATE, tier=2, issued_at=now_us(),
                          issued_by="trainguard-decide", cause_verdict_ids=["v-node-tgn2"],
                          params=MigrateParams(rank=1, ranks=[1], from_unit="tgn2",
                                               from_units=["tgn2"], reason="node lost"))
            subject = Subject(rank=1)
            cmd = signing.sign(keys.COMMAND, job.job_id, subject, cmd)
            prod = bus.producer()
            await prod.start()
            await prod.send(make_event(cmd, event_id="ev-node-loss", job_id=job.job_id,
                                       event_time=cmd.issued_at, source="test",
                                       subject=subject))
            await prod.stop()
            while not any(o.status in (OutcomeStatus.DONE, OutcomeStatus.FAILED)
                          for o in outcomes_on(bus)):
                assert loop.time() < t0 + 90 and not task.done()
                await asyncio.sleep(0.2)
            return loop.time() - t0

    try:
        took = asyncio.run(asyncio.wait_for(go(), 240))
        final = [o for o in outcomes_on(bus) if o.status is not OutcomeStatus.ACCEPTED]
        assert [o.status for o in final] == [OutcomeStatus.DONE], final
        live = {(r.rank, r.unit) for r in be.live(job)}
        assert live == {(0, "tgn1"), (1, "tgn3")}
        epochs = {r.epoch for r in be.live(job)}
        assert epochs == {2}  # every rank resumed at the new binding epoch
        old = be.step_of(job, 1, 1)
        assert old is not None and be.gone(old.step_id, timeout_s=0)
        lost = {n.name: n for n in cli.nodes()}["tgn2"]
        assert lost.health is not NodeHealth.USABLE  # drained (then DOWN: it could not confirm)
        assert lost.reason.startswith("trainguard cmd-node-loss verdicts v-node-tgn2"), lost
        print(f"tgn2 after the migrate: {lost.state} {lost.flags} reason {lost.reason!r}")
        print(f"signed migrate after node loss: done in {took:.1f} s")
    finally:
        for r in be.live(job):
            be.fence(job, r)
        subprocess.run(["scancel", str(alloc)], env=env, check=False)


def test_a_cut_off_node_is_powered_off_before_its_step_counts_as_gone(
        cluster: SlurmCluster, tmp_path: Path) -> None:
    """tgn1 and tgn2 partitioned (nftables drops everything to and from them), their steps
    still running. Slurm gives a step up once its node is DOWN, which proves nothing behind a
    partition: fenced by a backend with no fence command, rank 0's process lives on; fenced by
    one whose fence command is the dev cluster's power-off (a BMC's stand-in), rank 1's is
    gone before the fence returns."""
    from trainguard.drills.injectors.cluster import ClusterPartition

    cli, alloc = allocate(cluster)
    info = cluster.info()
    assert info is not None
    shared = Path(info.shared_dir)
    job = JobSpec(job_id="sj3", world_size=2,
                  command=("sh", "-c", f'echo $$ > {shared}/sj3-r{{rank}}; exec sleep 300'),
                  units=(UnitSpec("tgn1", (), 0), UnitSpec("tgn2", (), 1),
                         UnitSpec("tgn3", ())),
                  ckpt_dir=shared, grace_s=1.0)
    blind = SlurmBackend(cli, alloc, tmp_path / "blind")
    fenced = SlurmBackend(cli, alloc, tmp_path / "fenced", power_off=[
        sys.executable, "-m", "trainguard.cli.main", "dev", "slurm", "power-off", "{node}",
        "--state-dir", str(cluster.root)])
    parts = [ClusterPartition(n, NETNS_PREFIX + n, f"tgsv{i}")
             for i, n in ((1, "tgn1"), (2, "tgn2"))]
    try:
        r0 = blind.launch(job, job.unit("tgn1"), 0, 1, 0)
        r1 = fenced.launch(job, job.unit("tgn2"), 1, 1, 0)
        deadline = time.monotonic() + 30
        while not all((shared / f"sj3-r{r}").exists() for r in (0, 1)):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        pids = {r: int((shared / f"sj3-r{r}").read_text()) for r in (0, 1)}
        assert all(psutil.pid_exists(p) for p in pids.values())
        for part in parts:
            part.inject()
        # what the executor does for a verdict that blames a node: quarantine it, then fence
        blind.quarantine(job, "tgn1", "test: verdict blames tgn1")
        fenced.quarantine(job, "tgn2", "test: verdict blames tgn2")
        said0 = blind.fence(job, r0).items[0]
        said1 = fenced.fence(job, r1).items[0]
        assert "not powered off" in said0 and psutil.pid_exists(pids[0]), said0  # the hazard
        assert "powered off" in said1 and "not powered off" not in said1, said1
        assert ended(pids[1], 5.0)
    finally:
        for part in parts:
            with contextlib.suppress(Exception):
                part.undo()
        with contextlib.suppress(Exception):
            cluster.power_off("tgn1")
        subprocess.run(["scancel", str(alloc)], env=cli.env, check=False)


def test_a_spare_is_probed_on_its_node_for_storage_and_its_agent(
        cluster: SlurmCluster, tmp_path: Path) -> None:
    """The probe step runs on the node (its namespace, its slurmd): the shared directory takes
    a file and the node's agent socket (named per node with ``{unit}`` in the job's env, as the
    drills' job does) answers. A stand-in agent holds tgn2's socket; tgn3 has none."""
    import socket

    cli, alloc = allocate(cluster)
    info = cluster.info()
    assert info is not None
    shared = Path(info.shared_dir)
    agents = shared / f"probe-agents-{alloc}"
    (agents / "tgn2").mkdir(parents=True, exist_ok=True)
    job = JobSpec(job_id="sj4", world_size=1, command=("true",),
                  units=(UnitSpec("tgn1", (), 0), UnitSpec("tgn2", ()), UnitSpec("tgn3", ())),
                  ckpt_dir=shared,
                  env={"TRAINGUARD_AGENT_SOCKET": f"{agents}/{{unit}}/agent.sock"})
    backend = SlurmBackend(cli, alloc, tmp_path)
    held = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    held.bind(str(agents / "tgn2" / "agent.sock"))
    try:
        assert backend.unreachable(job, job.unit("tgn2")) is None
        assert backend.unreachable(job, job.unit("tgn3")) == (
            f"tgn3: its trainguard agent does not answer: agent socket "
            f"{agents}/tgn3/agent.sock: No such file or directory")
        plain = JobSpec(job_id="sj4", world_size=1, command=("true",), units=job.units,
                        ckpt_dir=shared)
        assert backend.unreachable(plain, job.unit("tgn3")) is None  # no socket named
    finally:
        held.close()
        subprocess.run(["scancel", str(alloc)], env=cli.env, check=False)


def test_a_cancelled_allocation_is_said_once_and_no_restart_runs_in_it(cluster: SlurmCluster,
                                                                       tmp_path: Path) -> None:
    """``scancel`` of the allocation (what a user, or the time limit, does): the actuator reads
    Slurm's final state, says ``job.ended`` once, signed, and a migrate decided before decide
    read it fails saying why, with nothing fenced or launched."""
    from trainguard.actuators import signing
    from trainguard.events.clock import now_us
    from trainguard.events.codec import make_event
    from trainguard.events.envelope import Event, Subject
    from trainguard.events.payloads import (
        Command,
        CommandAction,
        JobEnded,
        MigrateParams,
        SchedulerEnd,
    )

    cli, alloc = allocate(cluster)
    job = sleep_job("sj-end", cluster, tmp_path)
    be = SlurmBackend(cli, alloc, tmp_path)
    assert be.job_end() is None  # running
    bus = MemoryBus()
    opts = ActuatorOptions(job=job, key=keys.COMMAND_PUB, signer=keys.ACTUATOR,
                           state_dir=tmp_path / "state", launch=True, watch_s=0.5)

    def ended() -> list[Event]:
        return [e for e in bus.events(TopicRole.OUTCOMES) if isinstance(e.payload, JobEnded)]

    async def go() -> float:
        loop = asyncio.get_running_loop()
        async with actuator_running(bus, opts, be) as task:
            assert ended() == []
            subprocess.run(["scancel", str(alloc)], env=cli.env, check=True)
            t0 = loop.time()
            while not ended():
                assert loop.time() < t0 + 30 and not task.done()
                await asyncio.sleep(0.1)
            took = loop.time() - t0
            cmd = Command(command_id="cmd-after-end", idempotency_key="k-after-end",
                          action=CommandAction.MIGRATE, tier=2, issued_at=now_us(),
                          issued_by="trainguard-decide",
                          params=MigrateParams(rank=1, ranks=[1], from_unit="tgn2",
                                               from_units=["tgn2"], reason="process exit"))
            cmd = signing.sign(keys.COMMAND, job.job_id, Subject(rank=1), cmd)
            await bus.publish([make_event(cmd, event_id="ev-after-end", job_id=job.job_id,
                                          event_time=cmd.issued_at, source="test",
                                          subject=Subject(rank=1))])
            while not any(o.status is OutcomeStatus.FAILED for o in outcomes_on(bus)):
                assert loop.time() < t0 + 60 and not task.done()
                await asyncio.sleep(0.1)
            return took

    try:
        took = asyncio.run(asyncio.wait_for(go(), 180))
        (said,) = ended()
        assert signing.verify_event(keys.ACTUATOR_PUBS, said) is None
        p = said.payload
        assert isinstance(p, JobEnded)
        assert (p.end, p.state, p.allocation) == (SchedulerEnd.CANCELLED, "CANCELLED",
                                                  f"slurm:{alloc}")
        final = outcomes_on(bus)[-1]
        assert final.status is OutcomeStatus.FAILED and "the scheduler ended" in final.detail
        assert be.epoch(job) == 1  # nothing relaunched
        print(f"allocation {alloc} cancelled: job.ended said after {took:.2f} s")
    finally:
        subprocess.run(["scancel", str(alloc)], env=cli.env, check=False)


def test_an_allocation_past_its_time_limit_ends_timeout(cluster: SlurmCluster,
                                                        tmp_path: Path) -> None:
    """Slurm's own time limit (the shortest it takes: one minute) ends the allocation; the
    backend reads it as a deliberate end, ``timeout``, with Slurm's reason."""
    from trainguard.events.payloads import SchedulerEnd

    cli = ready(cluster)
    done = subprocess.run(["sbatch", "--parsable", "--time=1", "-N1", "-w", "tgn1",
                           "-o", "/dev/null", "--wrap", "sleep 600"], env=cli.env,
                          capture_output=True, text=True, check=True)
    alloc = int(done.stdout.strip().split(";")[0])
    be = SlurmBackend(cli, alloc, tmp_path)
    try:
        t0 = time.monotonic()
        while (end := be.job_end()) is None:
            assert time.monotonic() - t0 < 180, cli.job_state(alloc)
            time.sleep(1.0)
        assert (end.end, end.state, end.reason) == (SchedulerEnd.TIMEOUT, "TIMEOUT",
                                                    "TimeLimit"), end
        assert end.end.deliberate
        print(f"allocation {alloc} (--time=1) ended TIMEOUT after {time.monotonic() - t0:.0f} s")
    finally:
        subprocess.run(["scancel", str(alloc)], env=cli.env, check=False)



def elastic_job(job_id: str, cluster: SlurmCluster, tmp_path: Path) -> JobSpec:
    """Two slots (tgn1, tgn2) of the reference workload under torchrun, tgn3 the spare; the
    checkpoints and the progress logs in the cluster's shared directory."""
    info = cluster.info()
    assert info is not None
    shared = Path(info.shared_dir)
    progress = shared / f"progress-{job_id}"
    progress.mkdir(exist_ok=True)
    script = ["-m", "trainguard.workload.ddp", "--ckpt-dir", "{ckpt_dir}", "--allow-tmp-ckpt",
              "--steps", "100000", "--ckpt-every", str(CKPT_EVERY), "--step-ms", "150",
              "--timeout-s", "20", "--cpu",
              "--progress-file", str(progress / "rank{rank}-e{epoch}.jsonl")]
    command = torchrun_argv(info.rdzv_endpoint, nnodes=2, nproc_per_node=1, run_id="{job_id}",
                            script=script, max_restarts=3)
    return JobSpec(job_id=job_id, world_size=2, command=tuple(command), elastic=True,
                   units=(UnitSpec("tgn1", (), 0), UnitSpec("tgn2", (), 1),
                          UnitSpec("tgn3", ())),
                   ckpt_dir=shared / f"ckpt-{job_id}", grace_s=1.0,
                   env={"OMP_NUM_THREADS": "1"}, log_dir=tmp_path / "logs")


def lines(progress: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted(progress.glob("rank*-e*.jsonl")):
        for ln in path.read_text().splitlines():
            if ln.strip():
                out.append(json.loads(ln))
    return out


def test_an_elastic_job_swaps_the_lost_node_and_keeps_the_survivor(cluster: SlurmCluster,
                                                                  tmp_path: Path) -> None:
    """A signed MIGRATE after a node loss replaces that node's torchrun agent alone: the
    survivor's step is kept and bound at the new epoch, its worker restarted by its agent
    reads that epoch from the job's epoch file, and both slots resume from the newest
    checkpoint. A later RESUME then fences the kept replica too (by the epoch it was launched
    at) and relaunches both agents, which meet again in the rendezvous."""
    from trainguard.events.payloads import CommandAction, MigrateParams, ResumeParams

    cli, alloc = allocate(cluster)
    job = elastic_job("el1", cluster, tmp_path)
    job.ckpt_dir.mkdir(exist_ok=True)
    progress = Path(job.ckpt_dir.parent / "progress-el1")
    be = SlurmBackend(cli, alloc, tmp_path)
    bus = MemoryBus()
    opts = ActuatorOptions(job=job, key=keys.COMMAND_PUB, signer=keys.ACTUATOR,
                           state_dir=tmp_path / "state", launch=True)
    marks: dict[str, float] = {}

    def last_checkpoint() -> int:
        return max((ln["step"] for ln in lines(progress) if ln["kind"] == "checkpoint"),
                   default=0)

    async def stepping_after(t: float, task: asyncio.Task[None]) -> float:
        """Both slots started again after ``t`` and stepped: when."""
        while not all(_stepped_after(lines(progress), slot, t) for slot in (0, 1)):
            assert time.time() < t + 180 and not task.done(), lines(progress)[-6:]
            await asyncio.sleep(0.5)
        return time.time()

    async def go() -> None:
        loop = asyncio.get_running_loop()
        async with actuator_running(bus, opts, be) as task:
            survivor = be.step_of(job, 0, 1)
            assert survivor is not None
            while last_checkpoint() < 2 * CKPT_EVERY:  # stepping, and checkpointed twice
                assert loop.time() < marks.setdefault("up", loop.time()) + 180, lines(progress)
                assert not task.done()
                await asyncio.sleep(0.5)
            await asyncio.to_thread(lose_node, "tgn2", "tgsv2")
            marks["lost"] = time.time()
            marks["ckpt"] = last_checkpoint()
            await send_command(bus, job, "el-loss", CommandAction.MIGRATE, MigrateParams(
                rank=1, ranks=[1], from_unit="tgn2", from_units=["tgn2"], reason="node lost"))
            marks["done"] = await until_final(bus, task, 1, marks["lost"] + 90)
            marks["stepping"] = await stepping_after(marks["lost"], task)
            after = be.step_of(job, 0, 1)
            assert after is not None and after.step_id == survivor.step_id
            marks["live"] = len(be.live(job))
            marks["resume"] = time.time()
            await send_command(bus, job, "el-resume", CommandAction.RESUME, ResumeParams(
                rank=0, reason="test: the whole group in place"))
            await until_final(bus, task, 2, marks["resume"] + 90)
            marks["resumed"] = await stepping_after(marks["resume"], task)

    try:
        asyncio.run(asyncio.wait_for(go(), 420))
        final = [o for o in outcomes_on(bus) if o.status is not OutcomeStatus.ACCEPTED]
        assert [o.status for o in final] == [OutcomeStatus.DONE] * 2, final
        assert "ranks [0] keep their replicas" in final[0].detail
        assert marks["live"] == 2  # after the swap: the kept agent and the spare's
        old = be.step_of(job, 1, 1)
        assert old is not None and be.gone(old.step_id, timeout_s=0)
        got = lines(progress)
        starts = [ln for ln in got if ln["kind"] == "start"
                  and marks["lost"] < ln["time"] < marks["resume"]]
        # the survivor's worker, restarted by its agent, reads the group's new epoch
        assert sorted((s["rank"], s["epoch"]) for s in starts) == [(0, 2), (1, 2)], starts
        resumed = {s["resumed_from"] for s in starts}
        assert resumed == {marks["ckpt"]}, (resumed, marks["ckpt"])  # the newest checkpoint
        # the resume fenced the kept replica (launched at epoch 1) and relaunched both
        live = {(r.rank, r.unit, r.epoch) for r in be.live(job)}
        assert live == {(0, "tgn1", 3), (1, "tgn3", 3)}, live
        assert be.gone(survivor_step(be, job), timeout_s=0)
        print(f"elastic swap: command done {marks['done'] - marks['lost']:.1f} s after the "
              f"loss, both slots stepping {marks['stepping'] - marks['lost']:.1f} s after it; "
              f"resumed from step {marks['ckpt']}; a full resume after it stepping in "
              f"{marks['resumed'] - marks['resume']:.1f} s")
    finally:
        for r in be.live(job):
            be.fence(job, r)
        subprocess.run(["scancel", str(alloc)], env=cli.env, check=False)


def survivor_step(be: SlurmBackend, job: JobSpec) -> str:
    rec = be.step_of(job, 0, 1)
    assert rec is not None
    return rec.step_id


async def send_command(bus: MemoryBus, job: JobSpec, key: str, action: Any,
                       params: Any) -> None:
    """A command for ``job`` as decide signs it, on the bus."""
    from trainguard.actuators import signing
    from trainguard.events.clock import now_us
    from trainguard.events.codec import make_event
    from trainguard.events.envelope import Subject
    from trainguard.events.payloads import Command

    cmd = Command(command_id=f"cmd-{key}", idempotency_key=f"k-{key}", action=action,
                  tier=2, issued_at=now_us(), issued_by="trainguard-decide",
                  cause_verdict_ids=[f"v-{key}"], params=params)
    subject = Subject(rank=params.rank)
    cmd = signing.sign(keys.COMMAND, job.job_id, subject, cmd)
    prod = bus.producer()
    await prod.start()
    await prod.send(make_event(cmd, event_id=f"ev-{key}", job_id=job.job_id,
                               event_time=cmd.issued_at, source="test", subject=subject))
    await prod.stop()


async def until_final(bus: MemoryBus, task: asyncio.Task[None], n: int, deadline: float
                      ) -> float:
    """The ``n``-th command's final outcome is on the bus: when."""
    while sum(o.status is not OutcomeStatus.ACCEPTED for o in outcomes_on(bus)) < n:
        assert time.time() < deadline and not task.done()
        await asyncio.sleep(0.2)
    return time.time()


def _stepped_after(got: list[dict[str, Any]], slot: int, t: float) -> bool:
    """Did ``slot`` start again after ``t`` and then step?"""
    start = next((ln for ln in got if ln["kind"] == "start" and ln["rank"] == slot
                  and ln["time"] > t), None)
    return start is not None and any(
        ln["kind"] == "step" and ln["rank"] == slot and ln["time"] > start["time"]
        and ln["pid"] == start["pid"] for ln in got)
