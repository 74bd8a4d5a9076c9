"""The process collector on real child processes: SIGKILL, SIGSTOP, exit codes, non-children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from trainguard.collectors.process import ProcessCollector, exits_of
from trainguard.events.payloads import DepartureCause, ProcessDeparture, ProcessExit, ProcessState

INTERVAL_S = 1.0  # the agent's usual telemetry interval
SLEEPER = "import time; time.sleep(30)"
# Exits with 3 as soon as its stdin is closed: the test decides the moment of exit.
EXIT3_ON_EOF = "import sys; sys.stdin.read(); sys.exit(3)"

Spawn = Callable[..., "subprocess.Popen[Any]"]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    procs: list[subprocess.Popen[Any]] = []

    def _spawn(code: str = SLEEPER, **kw: Any) -> subprocess.Popen[Any]:
        p = subprocess.Popen([sys.executable, "-c", code], **kw)
        procs.append(p)
        return p

    yield _spawn
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        for stream in (p.stdin, p.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def collector() -> Iterator[ProcessCollector]:
    c = ProcessCollector("node-a")
    yield c
    c.close()


def _exit_within_interval(c: ProcessCollector, t0: float) -> list[ProcessExit]:
    """Wait at most one interval from ``t0`` for the exit, as the agent loop would."""
    assert c.wait(max(0.0, INTERVAL_S - (time.monotonic() - t0))), "no exit within one interval"
    assert time.monotonic() - t0 <= INTERVAL_S
    return exits_of(c.collect(2).discrete)


def _no_more_exits(c: ProcessCollector, rounds: int = 5) -> None:
    for i in range(rounds):
        assert exits_of(c.collect(10 + i).discrete) == []
        assert exits_of(c.poll_exits(20 + i)) == []


def test_sigkill_of_a_popen_child_is_one_exit_with_signal_9(
        collector: ProcessCollector, spawn: Spawn) -> None:
    p = spawn()
    collector.register_popen(p, "job-1", rank=0, binding_epoch=4)
    first = collector.collect(1)
    assert [s.state for s in first.processes] in (
        [ProcessState.SLEEPING], [ProcessState.RUNNING])
    assert first.discrete == []
    t0 = time.monotonic()
    os.kill(p.pid, signal.SIGKILL)
    reading_exits = _exit_within_interval(collector, t0)
    assert reading_exits == [ProcessExit(pid=p.pid, rank=0, binding_epoch=4, exit_code=None,
                                         signal=9, detected_by="waitpid")]
    _no_more_exits(collector)
    assert collector.watched() == []


def test_exit_code_3_is_reported_within_one_interval(
        collector: ProcessCollector, spawn: Spawn) -> None:
    p = spawn(EXIT3_ON_EOF, stdin=subprocess.PIPE)
    collector.register_popen(p, "job-1", rank=1, binding_epoch=0)
    assert collector.collect(1).discrete == []
    assert p.stdin is not None
    t0 = time.monotonic()
    p.stdin.close()
    (ex,) = _exit_within_interval(collector, t0)
    assert (ex.exit_code, ex.signal, ex.rank) == (3, None, 1)
    _no_more_exits(collector)


def test_the_exit_event_carries_job_subject_and_the_last_sample(
        collector: ProcessCollector, spawn: Spawn) -> None:
    p = spawn(EXIT3_ON_EOF, stdin=subprocess.PIPE)
    collector.register_popen(p, "job-7", rank=2, binding_epoch=1)
    assert p.stdin is not None
    p.stdin.close()
    p.wait(timeout=10)  # reaps here, so the collector's poll sees the stored code
    reading = collector.collect(123)
    (d,) = reading.discrete
    assert (d.job_id, d.event_time, d.subject.node, d.subject.rank) == ("job-7", 123, "node-a", 2)
    (s,) = reading.processes
    assert (s.pid, s.state, s.exit_code, s.job_id, s.rank) == (
        p.pid, ProcessState.EXITED, 3, "job-7", 2)


def test_sigstop_shows_stopped_then_kill_is_one_exit(
        collector: ProcessCollector, spawn: Spawn) -> None:
    p = spawn()
    collector.register_popen(p, "job-1", rank=0)
    os.kill(p.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    states: list[ProcessState] = []
    while time.monotonic() < deadline:
        states = [s.state for s in collector.collect(1).processes]
        if states == [ProcessState.STOPPED]:
            break
        time.sleep(0.02)
    assert states == [ProcessState.STOPPED]
    assert not collector.wait(0.05), "a stopped process has not exited"
    os.kill(p.pid, signal.SIGCONT)
    os.kill(p.pid, signal.SIGKILL)
    t0 = time.monotonic()
    (ex,) = _exit_within_interval(collector, t0)
    assert ex.signal == 9
    _no_more_exits(collector)


def test_a_child_registered_by_pid_is_seen_via_pidfd_and_not_reaped(
        collector: ProcessCollector, spawn: Spawn) -> None:
    p = spawn(EXIT3_ON_EOF, stdin=subprocess.PIPE)
    collector.register(p.pid, "job-1", rank=5, binding_epoch=2)  # no Popen handed in
    assert collector.exit_fds()
    assert p.stdin is not None
    t0 = time.monotonic()
    p.stdin.close()
    (ex,) = _exit_within_interval(collector, t0)
    assert (ex.exit_code, ex.signal, ex.detected_by) == (3, None, "pidfd")
    # Peeked with WNOWAIT: the Popen that owns the child still gets the right code.
    assert p.wait(timeout=5) == 3
    _no_more_exits(collector)


def _grandchild(spawn: Spawn, child_code: str) -> tuple[subprocess.Popen[Any], int]:
    """A parent that starts ``child_code``, prints its pid and never reaps it."""
    parent_code = ("import subprocess, sys, time\n"
                   f"c = subprocess.Popen([sys.executable, '-c', {child_code!r}])\n"
                   "print(c.pid, flush=True)\n"
                   "time.sleep(30)\n")
    parent = spawn(parent_code, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


def test_a_non_child_killed_is_seen_via_pidfd_with_its_signal(
        collector: ProcessCollector, spawn: Spawn) -> None:
    _parent, pid = _grandchild(spawn, SLEEPER)
    collector.register(pid, "job-1", rank=3, binding_epoch=1)
    assert len(collector.collect(1).processes) == 1
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    (ex,) = _exit_within_interval(collector, t0)
    # Not our child: the code is read from the zombie's /proc/<pid>/stat under the pidfd.
    assert (ex.pid, ex.exit_code, ex.signal, ex.detected_by) == (pid, None, 9, "pidfd")
    _no_more_exits(collector)


def test_a_non_child_exit_code_comes_from_the_zombie(
        collector: ProcessCollector, spawn: Spawn) -> None:
    _parent, pid = _grandchild(spawn, "import time, sys; time.sleep(0.3); sys.exit(3)")
    collector.register(pid, "job-1", rank=0)
    assert collector.wait(10)
    (ex,) = exits_of(collector.poll_exits(5))
    assert (ex.exit_code, ex.signal, ex.detected_by) == (3, None, "pidfd")
    (s,) = collector.collect(6).processes
    assert (s.state, s.exit_code) == (ProcessState.ZOMBIE, 3)
    _no_more_exits(collector)


def test_psutil_fallback_without_pidfd(spawn: Spawn) -> None:
    c = ProcessCollector("node-a", use_pidfd=False)
    _parent, pid = _grandchild(spawn, SLEEPER)
    c.register(pid, "job-1", rank=0)
    assert c.exit_fds() == []
    assert c.collect(1).discrete == []
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    exits: list[ProcessExit] = []
    while not exits and time.monotonic() < deadline:
        exits = exits_of(c.collect(2).discrete)
        time.sleep(0.02)
    assert exits == [ProcessExit(pid=pid, rank=0, exit_code=None, signal=9,
                                 detected_by="psutil")]
    _no_more_exits(c)


def test_a_pid_gone_before_registration_still_yields_one_exit(
        collector: ProcessCollector, spawn: Spawn) -> None:
    p = spawn("pass")
    p.wait(timeout=10)
    collector.register(p.pid, "job-1", rank=9)
    exits = exits_of(collector.collect(1).discrete)
    assert exits == [ProcessExit(pid=p.pid, rank=9, exit_code=None, signal=None,
                                 detected_by="psutil")]
    _no_more_exits(collector)


def test_unregister_stops_watching_without_an_exit(
        collector: ProcessCollector, spawn: Spawn) -> None:
    p = spawn()
    collector.register_popen(p, "job-1", rank=0)
    assert collector.unregister(p.pid)
    assert not collector.unregister(p.pid)
    p.kill()
    p.wait(timeout=10)
    assert collector.collect(1).discrete == []


def test_reregistering_updates_the_binding_epoch(
        collector: ProcessCollector, spawn: Spawn) -> None:
    p = spawn()
    collector.register_popen(p, "job-1", rank=0, binding_epoch=1)
    collector.register_popen(p, "job-1", rank=0, binding_epoch=2)
    assert collector.watched() == [p.pid]
    assert len(collector.exit_fds()) == 1
    p.kill()
    (ex,) = _exit_within_interval(collector, time.monotonic())
    assert ex.binding_epoch == 2


def test_samples_carry_resources_and_cpu_after_the_first(
        collector: ProcessCollector, spawn: Spawn) -> None:
    p = spawn()
    collector.register_popen(p, "job-1", rank=0)
    (s1,) = collector.collect(1).processes
    assert s1.cpu_pct is None  # psutil's first cpu_percent has no baseline
    assert s1.rss_bytes is not None and s1.rss_bytes > 0
    assert s1.threads is not None and s1.threads >= 1
    (s2,) = collector.collect(2).processes
    assert s2.cpu_pct is not None and s2.cpu_pct >= 0


def test_discover_by_environment_tag(collector: ProcessCollector, spawn: Spawn) -> None:
    env = dict(os.environ, TRAINGUARD_JOB_ID="job-env", TRAINGUARD_RANK="2",
               TRAINGUARD_BINDING_EPOCH="7")
    p = spawn(env=env)
    deadline = time.monotonic() + 5
    found: list[int] = []
    while p.pid not in found and time.monotonic() < deadline:
        found += collector.discover()
        time.sleep(0.02)  # the environ is readable once exec is done
    assert p.pid in found
    p.kill()
    p.wait(timeout=10)
    exits = [d for d in collector.collect(1).discrete
             if isinstance(d.payload, ProcessExit) and d.payload.pid == p.pid]
    assert len(exits) == 1
    assert exits[0].job_id == "job-env"
    assert exits_of(exits)[0].binding_epoch == 7
    assert exits_of(exits)[0].rank == 2


def test_bad_registration_is_refused(collector: ProcessCollector) -> None:
    with pytest.raises(ValueError):
        collector.register(0, "job-1")


def test_what_a_rank_declared_goes_with_its_exit_once(
        collector: ProcessCollector, spawn: Spawn) -> None:
    p = spawn(EXIT3_ON_EOF, stdin=subprocess.PIPE)
    q = spawn()
    said = ProcessDeparture(rank=0, pid=p.pid, cause=DepartureCause.PEER_LOST, exit_code=3,
                            reason="lost a peer at step 7")
    assert not collector.declare(p.pid, said)  # not watched yet: nothing to attach it to
    collector.register(p.pid, "job-1", rank=0, binding_epoch=1)
    collector.register_popen(q, "job-1", rank=1, binding_epoch=1)
    assert collector.declare(p.pid, said)
    collector.declare(p.pid, said.model_copy(update={"cause": DepartureCause.ERROR}))
    collector.register(p.pid, "job-1", rank=0, binding_epoch=1)  # re-registered: kept
    assert p.stdin is not None
    p.stdin.close()
    p.wait(timeout=10)
    q.kill()
    q.wait(timeout=10)
    time.sleep(0.05)
    exits = {e.pid: e for e in exits_of(collector.poll_exits(5))}
    assert (exits[p.pid].declared_code, exits[p.pid].declared_cause,
            exits[p.pid].declared_reason) == (3, DepartureCause.PEER_LOST,
                                              "lost a peer at step 7")
    assert exits[q.pid].signal == signal.SIGKILL and exits[q.pid].declared_cause is None
    # reaped by its parent (p.wait() here, slurmstepd under Slurm): only the declaration tells
    assert exits[p.pid].ended == "status unread, said peer_lost, code 3: lost a peer at step 7"
    assert exits[q.pid].ended == "signal 9"
    assert ProcessExit(pid=1).ended == "status unread"
    _no_more_exits(collector)
