"""StepReporter against a real StepReceiver over a real Unix datagram socket."""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from trainguard_sdk import ENV_SOCKET, StepReporter, default_socket_path, wire

from trainguard.collectors.base import Discrete
from trainguard.collectors.steps import StepReceiver
from trainguard.events.payloads import Heartbeat, StepReport


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    # AF_UNIX paths are limited to 107 bytes: pytest's tmp_path can be longer.
    d = Path(tempfile.mkdtemp(prefix="tgsdk", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def wait_for(pred: Callable[[], bool], timeout: float = 3.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def steps_of(items: list[Discrete]) -> list[StepReport]:
    return [d.payload for d in items if isinstance(d.payload, StepReport)]


def beats_of(items: list[Discrete]) -> list[Heartbeat]:
    return [d.payload for d in items if isinstance(d.payload, Heartbeat)]


def test_reports_arrive_with_equal_values(sock_dir: Path) -> None:
    path = sock_dir / "agent.sock"
    with StepReceiver("node-a", path) as rx, StepReporter(
            "job-42", 3, 8, dp_rank=1, pp_stage=2, tp_rank=0, binding_epoch=7, socket_path=path,
            heartbeat_interval_s=None) as tg:
        before = time.time_ns() // 1000
        assert tg.step(120, 3840, 182.5, comm_ms=20.1, data_wait_ms=1.5, step_ms=205.0,
                       loss=2.31, shard_offset=960)
        assert tg.step(121, 3872, 0.0, loss=math.nan)
        assert tg.step(122, 3904, 1.0, loss=-math.inf)
        after = time.time_ns() // 1000
        reading = rx.drain()
        assert reading.malformed == {}
    got = reading.discrete
    assert [type(d.payload) for d in got] == [StepReport] * 3
    assert got[0].payload == StepReport(
        rank=3, world_size=8, dp_rank=1, pp_stage=2, tp_rank=0, binding_epoch=7, step=120,
        samples_consumed=3840, shard_offset=960, compute_ms=182.5, comm_ms=20.1,
        data_wait_ms=1.5, step_ms=205.0, loss=2.31, pid=os.getpid())
    second = got[1].payload
    assert isinstance(second, StepReport) and second.loss is not None
    assert math.isnan(second.loss) and second.comm_ms is None and second.shard_offset is None
    assert steps_of(got)[2].loss == -math.inf
    for d in got:
        assert d.job_id == "job-42"
        assert d.subject.node == "node-a" and d.subject.rank == 3
        assert before <= d.event_time <= after
    assert tg.sent == 4 and tg.dropped == 0  # with close()'s "idle" heartbeat


def test_no_agent_is_quick_and_counted(sock_dir: Path) -> None:
    tg = StepReporter("job-1", 0, 1, socket_path=sock_dir / "nobody.sock",
                      heartbeat_interval_s=None)
    t0 = time.perf_counter()
    results = [tg.step(i, i, 1.0) for i in range(2000)]
    elapsed = time.perf_counter() - t0
    assert not any(results)
    assert tg.dropped == 2000 and tg.sent == 0
    assert elapsed < 1.0  # ~1 µs each; generous for a loaded CI machine
    assert not tg.heartbeat("data")
    tg.close()


def test_default_path_is_missing_directory_safe(sock_dir: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_SOCKET, str(sock_dir / "missing" / "dir" / "a.sock"))
    with StepReporter("job-1", 0, 1, heartbeat_interval_s=None) as tg:
        assert tg.socket_path == sock_dir / "missing" / "dir" / "a.sock"
        assert not tg.step(1, 1, 1.0)
        assert tg.dropped == 1


def test_agent_appearing_later_gets_reports(sock_dir: Path) -> None:
    path = sock_dir / "agent.sock"
    with StepReporter("job-1", 2, 4, socket_path=path, heartbeat_interval_s=None,
                      reconnect_interval_s=0.02) as tg:
        assert not tg.step(1, 1, 1.0)
        with StepReceiver("node-a", path) as rx:
            step = 2
            while not tg.step(step, step, 1.0):
                step += 1
                assert step < 10_000
                time.sleep(0.001)
            assert [r.step for r in steps_of(rx.drain().discrete)] == [step]
        assert tg.dropped == step - 1


def test_agent_restart_reconnects(sock_dir: Path) -> None:
    path = sock_dir / "agent.sock"
    with StepReporter("job-1", 0, 1, socket_path=path, heartbeat_interval_s=None,
                      reconnect_interval_s=0.02) as tg:
        with StepReceiver("node-a", path) as rx:
            assert tg.step(1, 1, 1.0)
            assert len(rx.drain().discrete) == 1
        with StepReceiver("node-a", path) as rx2:
            assert wait_for(lambda: tg.step(2, 2, 1.0))
            assert [r.step for r in steps_of(rx2.drain().discrete)] == [2]


def test_full_receiver_never_blocks(sock_dir: Path) -> None:
    path = sock_dir / "agent.sock"
    with StepReceiver("node-a", path) as rx, StepReporter(
            "job-1", 0, 1, socket_path=path, heartbeat_interval_s=None) as tg:
        t0 = time.perf_counter()
        for i in range(3000):
            tg.step(i, i, 1.0)
        elapsed = time.perf_counter() - t0
        assert elapsed < 2.0
        assert tg.dropped > 0 and tg.sent + tg.dropped == 3000
        assert tg.connected  # EAGAIN keeps the connection
        got = steps_of(rx.drain().discrete)
        assert len(got) == tg.sent
        assert [r.step for r in got] == list(range(tg.sent))  # the first ones, in order
        time.sleep(0.002)  # past the short pause a full queue starts
        assert tg.step(5000, 5000, 1.0)  # drained: room again


def test_heartbeat_thread_sends_and_stops(sock_dir: Path) -> None:
    path = sock_dir / "agent.sock"
    with StepReceiver("node-a", path) as rx:
        tg = StepReporter("job-1", 5, 8, binding_epoch=2, socket_path=path,
                          heartbeat_interval_s=0.03)
        assert tg._thread is not None and tg._thread.daemon
        assert wait_for(lambda: len(beats_of(rx.drain_discrete())) > 0)  # the "init" one
        tg.step(9, 90, 1.0)
        seen: list[Discrete] = []

        def beat_after_step() -> bool:
            seen.extend(rx.drain_discrete())
            return any(b.step == 9 for b in beats_of(seen))

        assert wait_for(beat_after_step)
        after_step = beats_of(seen)
        assert after_step[-1].step == 9 and after_step[-1].phase == "step"
        assert after_step[-1].rank == 5 and after_step[-1].binding_epoch == 2
        assert after_step[-1].pid == os.getpid()
        thread = tg._thread
        tg.close()
        assert not thread.is_alive()
        final = beats_of(rx.drain_discrete())
        assert final and final[-1].phase == "idle" and final[-1].step == 9
        time.sleep(0.1)
        assert rx.drain_discrete() == []
        assert not tg.step(10, 100, 1.0)  # closed: dropped, no raise
        tg.close()  # idempotent


def test_heartbeat_phase(sock_dir: Path) -> None:
    path = sock_dir / "agent.sock"
    with StepReceiver("node-a", path) as rx, StepReporter(
            "job-1", 0, 1, socket_path=path, heartbeat_interval_s=None) as tg:
        assert tg.phase == "init" and tg.last_step is None
        assert tg.heartbeat("init")
        tg.step(4, 40, 1.0)
        assert tg.phase == "step" and tg.last_step == 4
        assert tg.heartbeat("checkpoint")
        assert tg.phase == "checkpoint"
        assert not tg.heartbeat("lunch")  # unknown phase: counted, not raised
        assert tg.invalid == 1
        tg.step(5, 50, 1.0)
        assert tg.phase == "step"
        got = rx.drain().discrete
    beats = beats_of(got)
    assert [(b.phase, b.step) for b in beats] == [("init", None), ("checkpoint", 4)]


def test_values_the_wire_cannot_hold_are_counted_not_raised(sock_dir: Path) -> None:
    path = sock_dir / "agent.sock"
    with StepReceiver("node-a", path) as rx, StepReporter(
            "job-1", 0, 1, socket_path=path, heartbeat_interval_s=None) as tg:
        assert tg.step(1, 10, 1.0)
        assert not tg.step(-1, 10, 1.0)
        assert not tg.step(2, 10, "slow")  # type: ignore[arg-type]
        assert not tg.step(2**64, 10, 1.0)
        assert tg.invalid == 3 and tg.dropped == 3
        assert tg.last_step is None and tg.phase == "step"  # a failed pack zeroes the step
        assert tg.step(2, 20, -1.0)  # encodable; the receiver's payload model refuses it
        reading = rx.drain()
    assert [r.step for r in steps_of(reading.discrete)] == [1]
    assert reading.malformed == {"invalid_step_report": 1}


def test_bad_identity_raises_at_setup(sock_dir: Path) -> None:
    path = sock_dir / "x.sock"
    with pytest.raises(ValueError):
        StepReporter("bad job", 0, 1, socket_path=path, heartbeat_interval_s=None)
    with pytest.raises(ValueError):
        StepReporter("job-1", -1, 1, socket_path=path, heartbeat_interval_s=None)
    with pytest.raises(ValueError):
        StepReporter("job-1", 0, 0, socket_path=path, heartbeat_interval_s=None)
    with pytest.raises(ValueError):
        StepReporter("job-1", 0, 1, dp_rank=2**32, socket_path=path, heartbeat_interval_s=None)
    with pytest.raises(ValueError):
        StepReporter("job-1", 0, 1, socket_path=path, heartbeat_interval_s=0)


def test_hot_path_bytes_equal_the_reference_encoder(sock_dir: Path) -> None:
    path = sock_dir / "raw.sock"
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(str(path))
    with rx, StepReporter("job-9", 1, 2, tp_rank=1, socket_path=path,
                          heartbeat_interval_s=None) as tg:
        tg.step(7, 70, 3.5, step_ms=4.0, loss=0.5)
        data = rx.recv(1024)
    frame = wire.decode(data)
    assert isinstance(frame, wire.StepFrame)
    ref = wire.encode_step(frame)  # the hook sends nanoseconds; frames hold microseconds
    assert ref[:100] == data[:100] and ref[108:] == data[108:]
    assert int.from_bytes(ref[100:108], "little") == \
        int.from_bytes(data[100:108], "little") // 1000 * 1000
    assert frame.tp_rank == 1 and frame.dp_rank is None and frame.step_ms == 4.0


def test_heartbeat_thread_does_not_keep_the_process_alive(sock_dir: Path) -> None:
    code = textwrap.dedent(f"""
        from trainguard_sdk import StepReporter
        tg = StepReporter("job-1", 0, 1, socket_path={str(sock_dir / "a.sock")!r},
                          heartbeat_interval_s=0.01)
        tg.step(1, 1, 1.0)
        print("done", tg.dropped >= 1)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done True"


def test_forked_child_reports_its_own_pid(sock_dir: Path) -> None:
    path = sock_dir / "agent.sock"
    with StepReceiver("node-a", path) as rx, StepReporter(
            "job-1", 0, 1, socket_path=path, heartbeat_interval_s=None) as tg:
        tg.step(1, 1, 1.0)
        pid = os.fork()
        if pid == 0:  # the child: one report, no "idle" heartbeat on close
            try:
                tg.step(2, 2, 1.0)
                tg.close()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        got = rx.drain().discrete
    assert [(d.payload.step, d.payload.pid) for d in got  # type: ignore[attr-defined]
            ] == [(1, os.getpid()), (2, pid)]


def test_default_socket_path(tmp_path: Path) -> None:
    env = {ENV_SOCKET: "/x/y.sock"}
    assert default_socket_path(env) == Path("/x/y.sock")
    run = tmp_path / "run"
    (run / "trainguard").mkdir(parents=True)
    assert default_socket_path({}, run) == run / "trainguard" / "agent.sock"
    missing = tmp_path / "no-run"
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    assert default_socket_path({"XDG_RUNTIME_DIR": str(xdg)}, missing) == \
        xdg / "trainguard" / "agent.sock"
    fallback = default_socket_path({}, missing)
    assert fallback.name == "agent.sock"
    assert fallback.parent.name == f"trainguard-{os.getuid()}"


def test_concurrent_heartbeats_and_steps_are_all_counted(sock_dir: Path) -> None:
    path = sock_dir / "agent.sock"
    got: list[Discrete] = []
    stop = threading.Event()
    with StepReceiver("node-a", path) as rx:

        def drain() -> None:
            while not stop.is_set():
                got.extend(rx.drain_discrete())
                time.sleep(0.0005)

        drainer = threading.Thread(target=drain)
        drainer.start()
        try:
            with StepReporter("job-1", 0, 1, socket_path=path,
                              heartbeat_interval_s=0.005) as tg:
                for i in range(300):
                    tg.step(i, i, 1.0)
                    time.sleep(0.0002)
        finally:
            stop.set()
            drainer.join()
        got.extend(rx.drain_discrete())
    assert len(got) == tg.sent
    assert rx.malformed_total == {}
