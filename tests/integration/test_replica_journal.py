"""The actuator signals only what it launched and can re-prove (real processes).

Issue 11, reproduction 1 (the pid part): forged ``pool.unit`` events bind a ``sleep`` nobody
launched as rank 0 (epoch 1, then 2), and step reports carry its pid at a stale epoch; before
the replica journal, the actuator killed it. Now it is never signalled: not by the stale-report
check, not by the fence of a resume. And the warm launcher: every fork is in the journal before
it runs, a client holding the socket blocks nobody, strangers are refused.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.conftest import arun, read_events
from tests.integration.test_actuator_restart import start_actuator, write_spec
from tests.integration.test_fencing import alive, job_spec, reap
from trainguard.actuators import zygote
from trainguard.actuators.executor import Executor
from trainguard.actuators.jobspec import JobSpec, load_job_spec
from trainguard.actuators.journal import replicas
from trainguard.actuators.local import LocalBackend
from trainguard.actuators.pool import rebuild
from trainguard.bus.config import KafkaConfig
from trainguard.bus.producer import EventProducer
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import (
    Command,
    CommandAction,
    OutcomeStatus,
    PoolUnit,
    ReplicaRefused,
    StepReport,
    UnitState,
)
from trainguard.events.topics import TopicRole


def forged_bind(spec: JobSpec, epoch: int, pid: int | None) -> Event:
    return make_event(PoolUnit(unit="u0", state=UnitState.BOUND, node=spec.node, rank=0,
                               epoch=epoch, pid=pid, reason="forged"),
                      event_id=f"forged-bind-{epoch}", job_id=spec.job_id, event_time=epoch,
                      source="trainguard-actuator", subject=Subject(rank=0, unit="u0"))


def forged_report(spec: JobSpec, epoch: int, pid: int) -> Event:
    return make_event(StepReport(rank=0, world_size=1, binding_epoch=epoch, step=5,
                                 samples_consumed=5, compute_ms=1.0, pid=pid),
                      event_id=f"forged-report-{epoch}", job_id=spec.job_id, event_time=9,
                      source="forger", subject=Subject(rank=0))


def test_a_pid_nobody_launched_is_never_killed_whatever_the_log_says(tmp_path: Path) -> None:
    spec = job_spec(tmp_path, world=1, ignore_term=False)
    logged: list[Event] = []
    ex = Executor(spec, LocalBackend(tmp_path / "logs", use_cgroups=False), logged.append)
    ex.register_units()
    ex.launch_initial()
    real = ex.replicas()[0]
    victim = subprocess.Popen(["sleep", "60"])
    try:
        # a restarted actuator rebuilds its pool from a log holding the forger's events
        history = [*logged, forged_bind(spec, 1, victim.pid), forged_bind(spec, 2, victim.pid)]
        events: list[Event] = []
        ex2 = Executor(spec, LocalBackend(tmp_path / "logs", use_cgroups=False),
                       events.append, rebuild(history))
        assert ex2.pool.bound(spec.job_id)[0].pid == victim.pid  # the log believes it
        for epoch in (1, 0):
            ex2.check_report(forged_report(spec, epoch, victim.pid))
        time.sleep(0.2)
        assert victim.poll() is None
        # a resume fences "rank 0" (the forged pid: not signalled) and every replica the
        # journal proves alive (the real one), then launches a fresh epoch
        result = ex2.execute(Command(command_id="c-r", idempotency_key="k-r",
                                     action=CommandAction.RESUME, tier=3, issued_at=1,
                                     issued_by="test", params={"rank": 0}))
        assert result.status is OutcomeStatus.DONE, result.detail
        time.sleep(0.2)
        assert victim.poll() is None  # never signalled
        assert not alive(real.pid)  # the replica it did launch was fenced
        new = ex2.replicas()[0]
        assert new.epoch == 3 and alive(new.pid)
    finally:
        victim.kill()
        victim.wait(5)
        for rep in ex.replicas().values():
            reap(rep.pid)
        for rep in ex2.replicas().values():
            reap(rep.pid)
    refused = [e.payload for e in events if isinstance(e.payload, ReplicaRefused)]
    assert [(r.stale_epoch, r.action) for r in refused] == [(0, "discarded")]
    fenced = [e.payload for e in events if isinstance(e.payload, PoolUnit)
              and e.payload.state is UnitState.FENCED]
    assert any("not signalled" in item for f in fenced for item in f.released)


def test_the_warm_launcher_records_every_fork_and_refuses_strangers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}")
    spec = job_spec(tmp_path, world=1, ignore_term=False, warm=True)
    backend = LocalBackend(tmp_path / "logs", use_cgroups=False)
    path = backend.warm(spec)
    assert path.stat().st_mode & 0o777 == 0o600
    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    holder.connect(str(path))  # connects and never sends a request
    rep = None
    try:
        holder.sendall(b'{"module": "tg_fence_worker"')  # half a request, never finished
        rep = backend.launch(spec, spec.unit("u0"), 0, 1, 0, "c-warm")  # not blocked
        rec = [r for r in replicas(backend.journal, spec.job_id) if r.pid == rep.pid]
        assert len(rec) == 1 and (rec[0].rank, rec[0].epoch, rec[0].command_id) == (
            0, 1, "c-warm")
        assert [r.pid for r in backend.live(spec)] == [rep.pid]
        # another uid: refused by the socket's mode, and by SO_PEERCRED when the mode allows
        os.chmod(path, 0o666)
        probe = ("import os,socket,sys\nos.chdir(os.path.dirname(sys.argv[1]))\n"
                 "os.setuid(65534)\ns=socket.socket(socket.AF_UNIX)\ns.settimeout(10)\n"
                 "s.connect(os.path.basename(sys.argv[1]))\n"
                 "try:\n s.sendall(b'{}\\n'); got = s.recv(100)\n"
                 "except (BrokenPipeError, ConnectionResetError): got = b''\n"
                 "print('connected, answered:', repr(got))")
        out = subprocess.run([sys.executable, "-c", probe, str(path)],
                             capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == "connected, answered: b''", out  # closed unanswered
        assert not zygote.allowed(65534) and zygote.allowed(0)
    finally:
        holder.close()
        if rep is not None:
            backend.fence(spec, rep)
        zygote.stop(path)


def test_forged_pool_events_and_reports_on_the_broker_never_kill_a_stranger(
        kafka: KafkaConfig, tmp_path: Path) -> None:
    """The issue's reproduction end to end: forged ``pool.unit`` events on the outcomes topic,
    an actuator restart, then step reports naming the stranger's pid on the task topic."""
    spec, job = write_spec(tmp_path, grace_s=0.5)
    state = tmp_path / "state"
    first = start_actuator(kafka, spec, state)
    second: subprocess.Popen[bytes] | None = None
    victim = subprocess.Popen(["sleep", "120"])
    try:
        deadline = time.monotonic() + 60
        progress = tmp_path / "progress.txt"
        while not (progress.exists() and len(progress.read_text().split()) > 12):
            assert time.monotonic() < deadline, "the job was not launched"
            time.sleep(0.2)
        job_spec_ = load_job_spec(spec)

        async def forge(events: list[Event]) -> None:
            async with EventProducer(kafka) as prod:
                for event in events:
                    await prod.send(event)

        arun(forge([forged_bind(job_spec_, 1, victim.pid),  # as in the issue: the stranger
                    forged_bind(job_spec_, 2, None)]))  # "bound" once, then a newer epoch
        first.send_signal(signal.SIGTERM)
        first.wait(30)
        second = start_actuator(kafka, spec, state)
        time.sleep(6.0)  # rebuilt (the forged events included) and following the task topic
        for n in range(8):
            arun(forge([forged_report(job_spec_, 1, victim.pid).model_copy(
                update={"event_id": f"forged-report-1-{n}"}),
                forged_report(job_spec_, 0, victim.pid).model_copy(
                update={"event_id": f"forged-report-0-{n}"})]))
            time.sleep(0.5)
        time.sleep(2.0)
        assert victim.poll() is None  # never signalled
        assert second.poll() is None
        refused = [e.payload for e in read_events(kafka, [TopicRole.OUTCOMES])
                   if isinstance(e.payload, ReplicaRefused) and e.job_id == job]
        assert refused and {(r.pid, r.action) for r in refused} == {(victim.pid, "discarded")}
    finally:
        victim.kill()
        victim.wait(5)
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(20)
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if len(cmd) > 1 and cmd[1] == str(tmp_path / "worker.py"):
                reap(p.pid)
