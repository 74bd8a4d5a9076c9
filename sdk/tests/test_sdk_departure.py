"""What a rank says as it leaves: ``leaving()``, the excepthook that says it for an uncaught
exception, and which exceptions mean a lost peer. Against a plain Unix datagram socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainguard_sdk import StepReporter, wire
from trainguard_sdk.departure import cause_of, reason_of

SDK = str(Path(__file__).resolve().parents[1])


def _frames(rx: socket.socket) -> list[wire.Frame]:
    rx.settimeout(0.5)
    out: list[wire.Frame] = []
    while True:
        try:
            out.append(wire.decode(rx.recv(wire.MAX_DATAGRAM)))
        except socket.timeout:
            return out


def _departures(rx: socket.socket) -> list[wire.DepartureFrame]:
    return [f for f in _frames(rx) if isinstance(f, wire.DepartureFrame)]


def test_leaving_is_sent_once_with_identity(agent_socket: tuple[Path, socket.socket]) -> None:
    path, rx = agent_socket
    with StepReporter("job-9", 2, 4, binding_epoch=3, socket_path=path,
                      heartbeat_interval_s=None) as tg:
        assert tg.leaving(3, "peer_lost", "lost a peer at step 7:\n  Connection closed")
        assert not tg.leaving(0, "completed")  # once: the first account stands
        assert not tg.leaving(5, "bored")
    [d] = _departures(rx)
    assert (d.job_id, d.rank, d.binding_epoch, d.pid) == ("job-9", 2, 3, os.getpid())
    assert (d.cause, d.exit_code, d.reason) == (
        "peer_lost", 3, "lost a peer at step 7: Connection closed")  # one line


def test_a_value_the_wire_refuses_is_counted_not_raised(
        agent_socket: tuple[Path, socket.socket]) -> None:
    path, rx = agent_socket
    with StepReporter("job-9", 0, 1, socket_path=path, heartbeat_interval_s=None) as tg:
        assert not tg.leaving(300, "error")
    assert tg.invalid == 1 and _departures(rx) == []


def _run(path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(f"""
        import sys
        from trainguard_sdk import StepReporter
        tg = StepReporter("job-9", 1, 2, socket_path={str(path)!r}, heartbeat_interval_s=None)
        tg.step(1, 32, 1.0)
    """) + textwrap.dedent(body)
    env = {**os.environ, "PYTHONPATH": SDK}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(("raise_", "cause"), [
    ("raise RuntimeError('[gloo/transport/tcp/pair.cc:534] Connection closed by peer "
     "[10.0.0.2]:4242')", "peer_lost"),
    ("raise ValueError('bad batch shape')", "error"),
])
def test_an_uncaught_exception_says_why_and_the_traceback_still_prints(
        agent_socket: tuple[Path, socket.socket], raise_: str, cause: str) -> None:
    path, rx = agent_socket
    done = _run(path, raise_)
    assert done.returncode == 1 and "Traceback" in done.stderr  # the previous hook still ran
    [d] = _departures(rx)
    assert (d.cause, d.exit_code, d.rank) == (cause, 1, 1)
    assert d.reason is not None and d.reason.split(":")[0] in {"RuntimeError", "ValueError"}


def test_a_rank_killed_by_a_signal_says_nothing(
        agent_socket: tuple[Path, socket.socket]) -> None:
    path, rx = agent_socket
    done = _run(path, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert done.returncode == -signal.SIGKILL
    frames = _frames(rx)
    assert frames and not any(isinstance(f, wire.DepartureFrame) for f in frames)


class DistNetworkError(RuntimeError):  # torch.distributed's, recognised by name
    pass


class DistBackendError(RuntimeError):
    pass


def test_which_exceptions_mean_a_lost_peer() -> None:
    assert cause_of(DistNetworkError("Broken pipe")) == "peer_lost"
    assert cause_of(DistBackendError("NCCL error: remote process exited")) == "peer_lost"
    assert cause_of(RuntimeError("Connection reset by peer")) == "peer_lost"
    assert cause_of(RuntimeError("[Rank 1] Watchdog caught collective operation timeout: "
                                 "WorkNCCL(SeqNum=9)")) == "peer_lost"
    assert cause_of(RuntimeError("CUDA error: an illegal memory access")) == "error"
    assert cause_of(ConnectionResetError("reset")) == "error"  # not a collective: its own
    assert cause_of(ValueError("Connection reset by peer")) == "error"
    try:
        try:
            raise RuntimeError("Connection closed by peer")
        except RuntimeError as exc:
            raise KeyError("wrapped") from exc
    except KeyError as outer:
        assert cause_of(outer) == "peer_lost"  # the chain is followed


def test_reason_is_one_short_line() -> None:
    assert reason_of(ValueError("a\n  b")) == "ValueError: a b"
    assert reason_of(KeyError()) == "KeyError"
    assert len(reason_of(RuntimeError("x" * 5000))) == 500


@pytest.mark.parametrize(("raise_", "said"), [
    ("raise RuntimeError('Connection reset by peer')", ("peer_lost", 1)),
    ("sys.exit(3)", ("error", 3)),
    ("sys.exit()", ("completed", 0)),
])
def test_an_exception_leaving_the_with_block_is_said_before_it_closes(
        agent_socket: tuple[Path, socket.socket], raise_: str, said: tuple[str, int]) -> None:
    # the excepthook runs after the block closed the reporter: the block says it instead
    path, rx = agent_socket
    done = _run(path, f"""
        tg.close()
        with StepReporter("job-9", 1, 2, socket_path={str(path)!r},
                          heartbeat_interval_s=None):
            {raise_}
    """)
    assert done.returncode == said[1]
    [d] = _departures(rx)
    assert (d.cause, d.exit_code) == said
