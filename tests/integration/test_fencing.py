"""Fencing on real processes: the old replica is confirmed dead and its unit released before a
new one is bound; two live replicas of a rank never exist; a stale replica is killed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from trainguard.actuators import zygote
from trainguard.actuators.backend import Replica
from trainguard.actuators.executor import Executor
from trainguard.actuators.fencing import identify, stop_process
from trainguard.actuators.jobspec import JobSpec, UnitSpec
from trainguard.actuators.local import LocalBackend
from trainguard.collectors.process import parse_stat_exit_code
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import (
    CheckpointNowParams,
    Command,
    CommandAction,
    OutcomeStatus,
    PoolUnit,
    ReplicaRefused,
    RestartData,
    StepReport,
    UnitState,
)

WORKER = """
import os, signal, sys, time
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank, epoch, out = sys.argv[1], sys.argv[2], sys.argv[3]
def saved(*_):
    with open(out + ".saves", "a") as fh:
        fh.write(f"{rank} {os.getpid()}\\n")
signal.signal(signal.SIGUSR1, saved)  # a workload's save-on-command
while True:
    with open(out, "a") as fh:
        fh.write(f"{rank} {epoch} {os.getpid()}\\n")
    time.sleep(0.05)
"""


def job_spec(tmp_path: Path, world: int = 2, grace_s: float = 1.0,
             ignore_term: bool = True, warm: bool = False) -> JobSpec:
    """``warm``: ranks forked by the warm launcher (module ``tg_fence_worker`` on the
    launcher's path) instead of a fresh interpreter each."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    (tmp_path / "tg_fence_worker.py").write_text(WORKER)
    head = ("python", "-m", "tg_fence_worker") if warm else ("python", str(script))
    (tmp_path / "ckpt").mkdir(exist_ok=True)
    units = [UnitSpec(f"u{r}", (0,), r, {"rack": "r1"}) for r in range(world)]
    units += [UnitSpec("spare-far", (1,), None, {"rack": "r9"}),
              UnitSpec("spare-near", (1,), None, {"rack": "r1"})]
    return JobSpec(job_id=f"fence-{tmp_path.name[-12:]}".replace("_", "-"), world_size=world,
                   command=(*head, "{rank}", "{epoch}", str(tmp_path / "progress.txt")),
                   preload=("json",) if warm else (),
                   units=tuple(units), ckpt_dir=tmp_path / "ckpt", node="test-node",
                   grace_s=grace_s, env={"IGNORE_TERM": "1"} if ignore_term else {},
                   log_dir=tmp_path / "logs")


def reap(pid: int, grace_s: float = 0.1) -> None:
    """Test cleanup: stop whatever process ``pid`` is now (no journal proof: tests only)."""
    ident = identify(pid)
    if ident is not None:
        stop_process(ident, grace_s)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Census(threading.Thread):
    """Counts the live replicas of each rank every few ms: every pid that ever wrote a progress
    line for the rank, checked against the process table."""

    def __init__(self, progress: Path) -> None:
        super().__init__(daemon=True)
        self.progress = progress
        self.most: dict[str, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        pids: dict[str, set[int]] = {}
        while not self.stop.is_set():
            if self.progress.exists():
                for line in self.progress.read_text().splitlines():
                    parts = line.split()
                    if len(parts) == 3:
                        pids.setdefault(parts[0], set()).add(int(parts[2]))
            for rank, known in pids.items():
                n = sum(alive(pid) for pid in known)
                self.most[rank] = max(self.most.get(rank, 0), n)
            time.sleep(0.005)


def migrate(rank: int) -> Command:
    return Command(command_id="cmd-1", idempotency_key="key-1", action=CommandAction.MIGRATE,
                   tier=2, issued_at=1, issued_by="test", params={"rank": rank, "ranks": [rank]})


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm-launcher"])
def test_migrate_fences_a_replica_that_ignores_sigterm_before_binding(
        tmp_path: Path, warm: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # where the warm launcher finds the worker
    spec = job_spec(tmp_path, grace_s=1.0, warm=warm)
    events: list[Event] = []
    backend = LocalBackend(tmp_path / "logs", use_cgroups=False)
    ex = Executor(spec, backend, events.append)
    ex.register_units()
    census = Census(tmp_path / "progress.txt")
    census.start()
    try:
        ex.launch_initial()
        old = ex.replicas()
        time.sleep(0.5)
        result = ex.execute(migrate(1))
        assert result.status is OutcomeStatus.DONE, result.detail
        new = ex.replicas()
        time.sleep(0.3)
    finally:
        census.stop.set()
        census.join()
        for rep in ex.replicas().values():
            reap(rep.pid)
        zygote.stop(tmp_path / "logs" / f"zygote-{spec.job_id}.sock")
    assert census.most == {"0": 1, "1": 1}  # never two live replicas of one rank
    for rank, rep in old.items():  # old replicas are gone for good
        assert not alive(rep.pid), rank
    pids = {int(line.split()[2]) for line in (tmp_path / "progress.txt").read_text()
            .splitlines()}
    assert len(pids) == 4  # two ranks, two epochs, one process each
    assert new[1].unit == "spare-near" and new[0].unit == "u0"  # same rack preferred
    assert {r.epoch for r in new.values()} == {2}
    assert isinstance(result.data, RestartData)
    assert result.data.to_unit == "spare-near" and result.data.epoch == 2
    units = [e.payload for e in events if isinstance(e.payload, PoolUnit)]
    fenced = [u for u in units if u.state is UnitState.FENCED]
    assert {u.rank for u in fenced} == {0, 1}
    for u in fenced:  # SIGTERM ignored: killed after the grace, confirmed, released
        assert any("sigkill, confirmed dead" in r for r in u.released), u.released
    assert "quarantined" in next(u.reason for u in fenced if u.rank == 1)
    # every fence comes before any bind of the new epoch
    order = [(u.state, u.epoch) for u in units if u.state in (UnitState.FENCED,
                                                              UnitState.BOUND)]
    first_bind = order.index((UnitState.BOUND, 2))
    assert all(s is UnitState.BOUND for s, _ in order[first_bind:])
    lines = (tmp_path / "progress.txt").read_text().split()
    assert lines[-3:][1] == "2"  # the newest lines come from epoch 2


def report(spec: JobSpec, epoch: int, pid: int, n: int) -> Event:
    return make_event(StepReport(rank=0, world_size=1, binding_epoch=epoch, step=9,
                                 samples_consumed=9, compute_ms=1.0, pid=pid),
                      event_id=f"report-{n}", job_id=spec.job_id, event_time=n,
                      source="test", subject=Subject(rank=0))


def test_a_stale_replica_it_launched_is_killed_and_a_stranger_never(tmp_path: Path) -> None:
    spec = job_spec(tmp_path, world=1, ignore_term=False)
    events: list[Event] = []
    backend = LocalBackend(tmp_path / "logs", use_cgroups=False)
    ex = Executor(spec, backend, events.append)
    ex.register_units()
    ex.launch_initial()
    old = ex.replicas()[0]
    # the epoch-1 replica escaped its fence (say a partitioned node came back) while the
    # actuator launched epoch 2 of the rank: the journal holds both
    new = backend.launch(spec, spec.unit("u0"), 0, 2, 0, "c-escape")
    # a process nobody launched whose environment claims to be the rank
    ghost = subprocess.Popen([sys.executable, str(tmp_path / "worker.py"), "0", "1",
                              str(tmp_path / "ghost.txt")],
                             env={**os.environ, "TRAINGUARD_JOB_ID": spec.job_id,
                                  "TRAINGUARD_RANK": "0", "TRAINGUARD_BINDING_EPOCH": "1"})
    try:
        time.sleep(0.3)
        assert ex.check_report(report(spec, 1, old.pid, 1)) is True
        assert not alive(old.pid)
        assert ex.check_report(report(spec, 1, ghost.pid, 2)) is True
        assert ex.check_report(report(spec, 2, new.pid, 3)) is False
        time.sleep(0.3)
        assert ghost.poll() is None and alive(new.pid)  # never signalled
    finally:
        ghost.kill()
        ghost.wait(5)
        reap(new.pid)
    refused = [(e.payload.stale_epoch, e.payload.current_epoch, e.payload.action,
                e.payload.pid) for e in events if isinstance(e.payload, ReplicaRefused)]
    assert refused == [(1, 2, "killed", old.pid), (1, 2, "discarded", ghost.pid)]


def test_a_warm_launched_rank_that_dies_leaves_its_exit_status_readable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node agent is not the parent of a forked rank: it reads how the rank ended from the
    zombie's /proc/<pid>/stat, so the warm launcher must not reap it at once."""
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    spec = job_spec(tmp_path, world=1, ignore_term=False, warm=True)
    backend = LocalBackend(tmp_path / "logs", use_cgroups=False)
    rep = backend.launch(spec, spec.unit("u0"), 0, 1, 0)
    try:
        time.sleep(0.3)
        os.kill(rep.pid, 9)
        time.sleep(1.0)
        stat = Path(f"/proc/{rep.pid}/stat").read_text()
        status = parse_stat_exit_code(stat)
        assert status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9
        assert backend.fence(spec, rep).how == "already_gone"
    finally:
        zygote.stop(tmp_path / "logs" / f"zygote-{spec.job_id}.sock")


def test_checkpoint_now_asks_the_bound_replica_and_never_a_stranger(tmp_path: Path) -> None:
    spec = job_spec(tmp_path, ignore_term=False)
    backend = LocalBackend(tmp_path / "logs", use_cgroups=False)
    ex = Executor(spec, backend, lambda e: None)
    ex.register_units()
    saves = tmp_path / "progress.txt.saves"
    try:
        ex.launch_initial()
        reps = ex.replicas()
        progress = tmp_path / "progress.txt"

        def rank1_up() -> bool:  # its handler is installed before its first line
            return progress.exists() and any(
                line.startswith("1 ") for line in progress.read_text().splitlines())

        deadline = time.monotonic() + 20
        while not rank1_up() and time.monotonic() < deadline:
            time.sleep(0.02)
        cmd = Command(command_id="c-ck", idempotency_key="k-ck",
                      action=CommandAction.CHECKPOINT_NOW, tier=0, issued_at=1,
                      issued_by="test", params={"rank": 1})
        result = ex.execute(cmd)
        assert result.status is OutcomeStatus.DONE, result.detail
        deadline = time.monotonic() + 5  # the file exists a moment before its line is in it
        while not (saves.exists() and saves.read_text().endswith("\n")) \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        assert saves.read_text().split() == ["1", str(reps[1].pid)]  # that rank, once
        unbound = ex.execute(cmd.model_copy(update={"params": CheckpointNowParams(rank=7)}))
        assert unbound.status is OutcomeStatus.FAILED and "not bound" in unbound.detail
        # a pid that is not the rank (here: this test process) is never signalled
        with pytest.raises(OSError, match="is not rank 1"):
            backend.request_checkpoint(spec, Replica(1, "u1", 1, os.getpid()))
        # nor a process that claims the rank in its environment but was never launched
        bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                                env={**os.environ, "TRAINGUARD_JOB_ID": spec.job_id,
                                     "TRAINGUARD_RANK": "1"})
        try:
            time.sleep(0.3)
            with pytest.raises(OSError, match="not in the replica journal"):
                backend.request_checkpoint(spec, Replica(1, "u1", 1, bare.pid))
            assert bare.poll() is None  # still alive
        finally:
            bare.kill()
            bare.wait(5)
    finally:
        for rep in ex.replicas().values():
            reap(rep.pid)
