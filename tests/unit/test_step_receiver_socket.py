"""StepReceiver: binding, malformed datagrams among valid ones, async draining, liveness."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import stat
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainguard_sdk import StepReporter, wire

from trainguard.collectors.base import Collector, Discrete
from trainguard.collectors.steps import StepReceiver
from trainguard.events.codec import decode, encode, make_event
from trainguard.events.payloads import Heartbeat, StepReport


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tgrx", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def rx(sock_dir: Path) -> Iterator[StepReceiver]:
    with StepReceiver("node-a", sock_dir / "run" / "agent.sock") as receiver:
        yield receiver


@pytest.fixture
def tx(rx: StepReceiver) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.connect(str(rx.path))
    with sock:
        yield sock


def step(n: int, **kw: object) -> bytes:
    fields: dict[str, object] = {"job_id": "job-1", "event_time": 1_000 + n, "rank": 2,
                                 "world_size": 4, "step": n, "samples_consumed": n * 8,
                                 "compute_ms": 1.5, **kw}
    return wire.encode_step(wire.StepFrame(**fields))  # type: ignore[arg-type]


def beat(n: int, **kw: object) -> bytes:
    fields: dict[str, object] = {"job_id": "job-1", "event_time": 1_000 + n, "rank": 2,
                                 "step": n, **kw}
    return wire.encode_heartbeat(wire.HeartbeatFrame(**fields))  # type: ignore[arg-type]


def test_binds_with_directory_and_mode(sock_dir: Path, rx: StepReceiver) -> None:
    assert rx.path.parent.is_dir()
    st_ = os.stat(rx.path)
    assert stat.S_ISSOCK(st_.st_mode) and stat.S_IMODE(st_.st_mode) == 0o660
    assert isinstance(rx.fileno(), int) and rx.fileno() >= 0
    collector: Collector = rx  # the Collector protocol
    assert collector.name == "steps"
    assert collector.collect(0).discrete == []


def test_close_removes_the_socket_file(sock_dir: Path) -> None:
    path = sock_dir / "a.sock"
    rx = StepReceiver("node-a", path, mode=0o666)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666
    rx.close()
    assert not path.exists()
    rx.close()  # idempotent
    assert rx.drain().discrete == []


def test_stale_socket_is_replaced_live_one_refused(sock_dir: Path) -> None:
    path = sock_dir / "a.sock"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stale.bind(str(path))
    stale.close()  # the file stays: a crashed agent's leftover
    assert path.exists()
    with StepReceiver("node-a", path) as live:
        with pytest.raises(OSError, match="another receiver"):
            StepReceiver("node-a", path)
        assert live.path.exists()
    plain = sock_dir / "file"
    plain.write_text("not a socket")
    with pytest.raises(OSError, match="not a socket"):
        StepReceiver("node-a", plain)
    assert plain.read_text() == "not a socket"


def test_a_newer_receiver_on_the_path_is_not_unlinked_by_the_old(sock_dir: Path) -> None:
    path = sock_dir / "a.sock"
    old = StepReceiver("node-a", path)
    os.unlink(path)  # someone removed it and a new agent bound the path
    with StepReceiver("node-a", path):
        old.close()
        assert path.exists()


def test_malformed_counted_valid_neighbours_kept(
        rx: StepReceiver, tx: socket.socket, caplog: pytest.LogCaptureFixture) -> None:
    good = step(1)
    datagrams = [
        step(1),
        b"",                                          # bad_length
        b"XX" + good[2:],                             # bad_magic
        step(2),
        b"XX" + good[2:],                             # bad_magic again: logged once
        good[:2] + b"\x09" + good[3:],                # bad_version
        good[:3] + b"\x05" + good[4:],                # bad_kind
        good + b"!",                                  # bad_length
        beat(3, phase="data"),
        good[:-5] + b"\xff\xfe-1-",                   # bad_job_id
        good[:34] + struct.pack("<H", 1 << 15) + good[36:],   # bad_flags
        step(4, world_size=0),                        # invalid_step_report
        step(5, compute_ms=float("nan")),             # invalid_step_report
        step(6, event_time=2**53),                    # invalid_event_time
        good[:6] + b"\x00" * 2000,                    # truncated to the buffer: bad_length
        step(7, loss=float("inf")),
    ]
    with caplog.at_level(logging.WARNING, logger="trainguard.collectors.steps"):
        for d in datagrams[:8]:
            tx.send(d)
        first = rx.drain()
        for d in datagrams[8:]:
            tx.send(d)
        second = rx.drain()
    assert [(type(d.payload).__name__, d.payload.step)  # type: ignore[attr-defined]
            for d in first.discrete + second.discrete] == [
        ("StepReport", 1), ("StepReport", 2), ("Heartbeat", 3), ("StepReport", 7)]
    total: dict[str, int] = {}
    for r in (first, second):
        for k, v in r.malformed.items():
            total[k] = total.get(k, 0) + v
    assert total == {"bad_length": 3, "bad_magic": 2, "bad_version": 1, "bad_kind": 1,
                     "bad_job_id": 1, "bad_flags": 1, "invalid_step_report": 2,
                     "invalid_event_time": 1}
    assert rx.malformed_total == total
    assert rx.received == len(datagrams)
    warned = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(warned) == len(total)  # once per kind


def test_malformed_seen_by_the_async_path_reported_by_the_next_drain(
        rx: StepReceiver, tx: socket.socket) -> None:
    tx.send(b"junkjunk")
    tx.send(step(1))
    assert len(rx.drain_discrete()) == 1
    assert rx.drain().malformed == {"bad_magic": 1}
    assert rx.drain().malformed == {}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=700), max_size=5))
def test_random_datagrams_never_raise(datagrams: list[bytes]) -> None:
    d = Path(tempfile.mkdtemp(prefix="tgrh", dir="/tmp"))
    try:
        with StepReceiver("node-a", d / "a.sock") as rx, \
                socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as tx:
            tx.connect(str(rx.path))
            for data in [step(0), *datagrams, step(1)]:
                tx.send(data)
            reading = rx.drain()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    steps = [x.payload.step for x in reading.discrete]  # type: ignore[attr-defined]
    assert steps[0] == 0 and steps[-1] == 1
    assert len(reading.discrete) + sum(reading.malformed.values()) == len(datagrams) + 2


def test_discrete_items_make_valid_events(rx: StepReceiver) -> None:
    with StepReporter("job-7", 1, 2, dp_rank=1, socket_path=rx.path,
                      heartbeat_interval_s=None) as tg:
        tg.heartbeat("init")
        tg.step(3, 30, 10.0, loss=float("nan"))
        items = rx.drain().discrete
    assert [type(i.payload) for i in items] == [Heartbeat, StepReport]
    for i, item in enumerate(items):
        event = make_event(item.payload, event_id=f"evt-0000{i}", job_id=item.job_id,
                           event_time=item.event_time, source="agent@node-a",
                           subject=item.subject)
        back = decode(encode(event))
        assert back.type == event.type and back.subject.rank == 1


def test_last_seen_and_stale(rx: StepReceiver, tx: socket.socket) -> None:
    tx.send(step(1, event_time=5_000))
    tx.send(step(2, rank=3, event_time=9_000))
    tx.send(beat(1, event_time=6_000, phase="checkpoint"))
    tx.send(step(0, event_time=4_000))  # late arrival: does not move last_seen back
    rx.drain()
    seen = rx.last_seen[("job-1", 2)]
    assert (seen.event_time, seen.kind, seen.phase) == (6_000, "heartbeat", "checkpoint")
    assert rx.last_seen[("job-1", 3)].step == 2
    assert rx.stale(now_us=10_000, older_than_us=2_000) == [("job-1", 2)]


def test_drain_bounded_by_max(rx: StepReceiver, tx: socket.socket) -> None:
    for n in range(6):
        tx.send(step(n))
    assert len(rx.drain(max_datagrams=4).discrete) == 4
    assert len(rx.drain().discrete) == 2


def test_reader_with_asyncio_add_reader(rx: StepReceiver) -> None:
    async def main() -> list[Discrete]:
        loop = asyncio.get_running_loop()
        got: list[Discrete] = []
        done = asyncio.Event()
        fd, drain = rx.reader()

        def on_readable() -> None:
            got.extend(drain())
            if len(got) >= 20:
                done.set()

        loop.add_reader(fd, on_readable)
        try:
            with StepReporter("job-1", 0, 1, socket_path=rx.path,
                              heartbeat_interval_s=None) as tg:
                for n in range(20):
                    tg.step(n, n, 1.0)
                    await asyncio.sleep(0.001)  # the loop drains between steps
                await asyncio.wait_for(done.wait(), 5)
        finally:
            loop.remove_reader(fd)
        return got

    got = asyncio.run(main())
    assert [d.payload.step for d in got[:20]] == list(range(20))  # type: ignore[attr-defined]
