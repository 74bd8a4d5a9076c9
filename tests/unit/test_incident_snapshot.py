"""`incident serve` restarts from a snapshot plus offsets: the fold's state survives a JSON round
trip and folds on exactly as before; a service stopped (or killed) at any point and started
again from its snapshot publishes exactly what one uninterrupted run publishes, reading on from
the snapshot's offsets; a snapshot that is corrupt, of another version or of another log is
said in one line and the service rebuilds from the log instead."""

from __future__ import annotations

import asyncio
import logging
import random
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard.bus.memory import MemoryBus
from trainguard.events.codec import encode
from trainguard.events.envelope import Event
from trainguard.events.topics import TopicRole
from trainguard.incidents import IncidentSettings, LiveIncidents, rebuild
from trainguard.incidents.aggregate import FOLDED_TYPES
from trainguard.incidents.query import canonical
from trainguard.incidents.service import INPUT_ROLES, ServiceStats, Snapshots, serve
from trainguard.incidents.snapshot import (
    FILE_NAME,
    Snapshot,
    SnapshotStore,
    decode_snapshot,
    encode_snapshot,
)
from trainguard.incidents.state_codec import SnapshotError
from trainguard.incidents.synth import Scenario, incident_log

pytestmark = pytest.mark.unit
SETTINGS = IncidentSettings(lateness_us=3_000_000)
LOG = incident_log(Scenario(restart_all=True, peer_exits=True))
FOLDED = [e for e in LOG if e.type in FOLDED_TYPES]
REFERENCE = sorted(canonical(t) for t in rebuild(LOG, SETTINGS))
CHUNKS = 12
GROUP = "tg-incidents"


def arrivals(seed: int) -> list[Event]:
    """Each record delayed by less than the lateness bound (as test_incident_determinism)."""
    rng = random.Random(seed)
    keyed = [(e.event_time + rng.randrange(SETTINGS.lateness_us // 2), i, e)
             for i, e in enumerate(LOG)]
    return [e for _, _, e in sorted(keyed, key=lambda k: (k[0], k[1]))]


def chunks(events: list[Event]) -> list[list[Event]]:
    size = -(-len(events) // CHUNKS)
    return [events[i:i + size] for i in range(0, len(events), size)]


# --- the fold's state as JSON -------------------------------------------------------------


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), cut=st.integers(0, len(FOLDED)),
       history_max=st.sampled_from([2, 50, 100_000]))
def test_a_restored_fold_folds_on_exactly_as_the_original(seed: int, cut: int,
                                                          history_max: int) -> None:
    events = [e for e in arrivals(seed) if e.type in FOLDED_TYPES]
    a = LiveIncidents(SETTINGS, history_max=history_max)
    for ev in events[:cut]:
        a.feed(ev)
    a.catch_up()
    doc = orjson.loads(orjson.dumps(a.snapshot()))  # through the bytes, as the file has it
    b = LiveIncidents(SETTINGS, history_max=history_max)
    b.restore(doc)
    assert orjson.dumps(b.snapshot()) == orjson.dumps(doc)
    out_a: list[Event] = []
    out_b: list[Event] = []
    for ev in events[cut:]:
        out_a += a.feed(ev)
        out_b += b.feed(ev)
    out_a += a.flush()
    out_b += b.flush()
    assert [encode(t) for t in out_b] == [encode(t) for t in out_a]
    assert orjson.dumps(b.snapshot()) == orjson.dumps(a.snapshot())


def test_a_document_that_is_not_a_snapshot_leaves_the_fold_as_it_was() -> None:
    live = LiveIncidents(SETTINGS)
    for ev in FOLDED:
        live.feed(ev)
    before = orjson.dumps(live.snapshot())
    doc = live.snapshot()
    doc["jobs"]["job-a"]["history"][3][2] = {"not": "an encoded event"}
    with pytest.raises(SnapshotError, match="history"):
        live.restore(doc)
    doc = live.snapshot()
    doc["jobs"]["job-a"]["book"]["incidents"][0]["transitions"][0] = '{"not": "an event"}'
    with pytest.raises(SnapshotError, match="event"):
        live.restore(doc)
    with pytest.raises(SnapshotError):
        live.restore({"jobs": {"job-a": {}}})
    assert orjson.dumps(live.snapshot()) == before


# --- the file -------------------------------------------------------------------------------


def _snap() -> Snapshot:
    live = LiveIncidents(SETTINGS)
    for ev in FOLDED[:100]:
        live.feed(ev)
    return Snapshot({"prefix": "tg"}, {("tg.task", 0): 7}, live.snapshot())


def test_the_file_round_trips_and_every_damage_is_named_in_one_line(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "state")
    assert store.read() is None
    data = encode_snapshot(_snap())
    store.write(data)
    got = store.read()
    assert got is not None and got.offsets == {("tg.task", 0): 7}
    assert encode_snapshot(got) == data
    assert [p.name for p in store.directory.iterdir()] == [FILE_NAME]  # no temporary left
    head, body = data.split(b"\n", 1)
    damaged = {
        "truncated": data[:-10],
        "a flipped byte": head + b"\n" + body[:50] + bytes([body[50] ^ 1]) + body[51:],
        "no header": body,
        "another version": head.replace(b'"version":1', b'"version":2') + b"\n" + body,
        "garbage": b"\x00\xff garbage",
        "empty": b"",
    }
    for what, bad in damaged.items():
        with pytest.raises(SnapshotError) as err:
            decode_snapshot(bad)
        assert "\n" not in str(err.value), what


# --- the service ----------------------------------------------------------------------------


def _all_committed(bus: MemoryBus) -> bool:
    return bus.committed_offset(GROUP, INPUT_ROLES) == bus.end_offset(INPUT_ROLES)


def _published(bus: MemoryBus) -> list[bytes]:
    return sorted(canonical(e) for e in bus.events(TopicRole.INCIDENTS)
                  if e.type == "incident.transition")


async def _wait(cond: object, limit_s: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not cond() and loop.time() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.005)
    assert cond(), "timed out"  # type: ignore[operator]


async def _run_to_the_end(bus: MemoryBus, snapshots: Snapshots | None) -> ServiceStats:
    """Serve until every input record is committed and the idle flush emptied the buffer."""
    live = LiveIncidents(SETTINGS)
    stats = ServiceStats()
    stop = asyncio.Event()
    task = asyncio.create_task(serve(bus, settings=SETTINGS, group=GROUP, idle_flush_s=0.05,
                                     stop=stop, stats=stats, live=live, snapshots=snapshots,
                                     poll_ms=10))
    await _wait(lambda: _all_committed(bus) and not live.buffered
                and (stats.consumed > 0 or stats.restored))
    await asyncio.sleep(0.03)  # a poll or two more: nothing comes
    stop.set()
    await task
    return stats


def _uninterrupted(seed: int) -> list[bytes]:
    bus = MemoryBus()

    async def go() -> None:
        await bus.publish(arrivals(seed))
        await _run_to_the_end(bus, None)

    asyncio.run(asyncio.wait_for(go(), 60))
    return _published(bus)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), data=st.data())
def test_serve_restarted_from_its_snapshot_publishes_what_one_run_publishes(
        tmp_path_factory: pytest.TempPathFactory, seed: int, data: st.DataObject) -> None:
    parts = chunks(arrivals(seed))
    cut = data.draw(st.integers(0, len(parts)), label="chunks before the cut")
    before_start = data.draw(st.integers(0, cut), label="chunks on the log at the first start")
    every = data.draw(st.integers(1, 4), label="snapshot every N batches")
    killed = data.draw(st.booleans(), label="killed (else stopped)")
    store = SnapshotStore(tmp_path_factory.mktemp("state"))
    snapshots = Snapshots(store, interval_s=3600, every_batches=every)
    bus = MemoryBus()

    async def go() -> tuple[ServiceStats, ServiceStats, bool]:
        for chunk in parts[:before_start]:
            await bus.publish(chunk)
        first = ServiceStats()
        stop = asyncio.Event()
        task = asyncio.create_task(serve(bus, settings=SETTINGS, group=GROUP,
                                         idle_flush_s=3600, stop=stop, stats=first,
                                         snapshots=snapshots, poll_ms=10))
        await _wait(lambda: first.consumed > 0 or before_start == 0)
        for chunk in parts[before_start:cut]:  # one batch each
            await bus.publish(chunk)
            await _wait(lambda: _all_committed(bus))
        if killed:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        else:
            stop.set()
            await task
        had_snapshot = store.path.exists()
        for chunk in parts[cut:]:
            await bus.publish(chunk)
        second = await _run_to_the_end(bus, snapshots)
        return first, second, had_snapshot

    first, second, had_snapshot = asyncio.run(asyncio.wait_for(go(), 90))
    got = _published(bus)
    assert got == _uninterrupted(seed)
    assert got == REFERENCE
    assert len(bus.events(TopicRole.INCIDENTS)) == len(REFERENCE)  # nothing published twice
    if not killed:  # (killed: a write begun in its thread may still land after the kill)
        assert second.restored == had_snapshot
        if first.batches:  # a clean stop writes one
            assert had_snapshot and first.snapshots >= 1
    if second.restored:  # read on from the snapshot's offsets, not from earliest
        assert second.consumed < bus.end_offset(INPUT_ROLES)


def _snapshot_then_restart(tmp_path: Path, damage: object, caplog: pytest.LogCaptureFixture
                           ) -> tuple[ServiceStats, list[str]]:
    """One run writes a snapshot; ``damage(path)`` spoils it; a restart on the same log."""
    store = SnapshotStore(tmp_path / "state")
    snapshots = Snapshots(store, interval_s=3600, every_batches=1)
    bus = MemoryBus()

    async def go() -> ServiceStats:
        await bus.publish(LOG)
        await _run_to_the_end(bus, snapshots)
        assert store.path.exists()
        damage(store.path)  # type: ignore[operator]
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="trainguard.incidents.service"):
            return await _run_to_the_end(bus, snapshots)

    stats = asyncio.run(asyncio.wait_for(go(), 60))
    assert _published(bus) == sorted(canonical(t) for t in rebuild(LOG, SETTINGS))
    lines = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    return stats, lines


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x20
    path.write_bytes(bytes(data))


def _other_settings(path: Path) -> None:
    snap = decode_snapshot(path.read_bytes())
    identity = {**snap.identity, "settings": {**snap.identity["settings"], "lateness_us": 1}}
    path.write_bytes(encode_snapshot(Snapshot(identity, snap.offsets, snap.state)))


@pytest.mark.parametrize("damage", [
    pytest.param(_flip, id="a flipped byte"),
    pytest.param(lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 3]),
                 id="truncated"),
    pytest.param(lambda p: p.write_bytes(b"\x00" * 64), id="garbage"),
    pytest.param(lambda p: p.write_bytes(p.read_bytes().replace(b'"version":1', b'"version":9',
                                                                  1)), id="another version"),
    pytest.param(lambda p: _other_settings(p), id="another fold's (checksum and all)"),
    pytest.param(lambda p: (p.unlink(), p.mkdir()), id="unreadable (a directory)"),
])
def test_a_corrupt_snapshot_is_said_in_one_line_and_the_service_rebuilds(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: object) -> None:
    stats, lines = _snapshot_then_restart(tmp_path, damage, caplog)
    assert not stats.restored
    assert len(lines) == 1 and "\n" not in lines[0] and "rebuilding from the log" in lines[0]
    assert stats.already_published == len(REFERENCE) and stats.published == 0


def test_a_sound_snapshot_of_the_same_log_is_used(tmp_path: Path,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    stats, lines = _snapshot_then_restart(tmp_path, lambda p: None, caplog)
    assert stats.restored and not lines
    assert stats.consumed == 0 and stats.published == 0  # nothing read again


def test_a_kept_record_that_no_longer_decodes_sets_the_snapshot_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A restored record that the codec cannot read when it is folded again: the service stops
    with one line and moves the snapshot aside, so the next start rebuilds from the log
    instead of loading it again and failing the same way (no crash loop)."""
    from trainguard.incidents import live as live_module

    store = SnapshotStore(tmp_path / "state")
    snapshots = Snapshots(store, interval_s=3600, every_batches=1)
    bus = MemoryBus()
    bad = live_module._Raw(1, "e-bad", "{not json")
    with pytest.raises(SnapshotError, match="e-bad"):
        bad.event()

    def unreadable(self: LiveIncidents) -> list[Event]:
        raise SnapshotError("kept record e-bad of the snapshot does not decode: boom")

    async def go() -> ServiceStats:
        await bus.publish(LOG)
        await _run_to_the_end(bus, snapshots)
        with monkeypatch.context() as m:  # a restored job took a late record
            m.setattr(LiveIncidents, "catch_up", unreadable)
            m.setattr(LiveIncidents, "dirty", property(lambda self: True))
            with pytest.raises(SnapshotError) as err:
                await asyncio.wait_for(serve(bus, settings=SETTINGS, group=GROUP,
                                             idle_flush_s=0.05, snapshots=snapshots,
                                             poll_ms=10), 20)
        message = str(err.value)
        assert "\n" not in message and "set aside" in message and "e-bad" in message
        assert not store.path.exists()
        assert store.path.with_name(store.path.name + ".unusable").exists()
        return await _run_to_the_end(bus, snapshots)

    stats = asyncio.run(asyncio.wait_for(go(), 60))
    assert not stats.restored  # rebuilt from the log
    assert _published(bus) == sorted(canonical(t) for t in rebuild(LOG, SETTINGS))


def test_a_snapshot_of_another_log_is_not_used(tmp_path: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    """The same prefix and group on a new broker: its transitions are not on the topic."""
    store = SnapshotStore(tmp_path / "state")
    snapshots = Snapshots(store, interval_s=3600, every_batches=1)

    async def go() -> ServiceStats:
        await (old := MemoryBus()).publish(LOG)
        await _run_to_the_end(old, snapshots)
        new = MemoryBus()
        await new.publish(LOG[: len(LOG) // 2])
        with caplog.at_level(logging.INFO, logger="trainguard.incidents.service"):
            return await _run_to_the_end(new, snapshots)

    stats = asyncio.run(asyncio.wait_for(go(), 60))
    assert not stats.restored
    lines = [r.getMessage() for r in caplog.records if "not used" in r.getMessage()]
    assert len(lines) == 1 and "another log" in lines[0]


# --- the flags ------------------------------------------------------------------------------


def test_serve_flags_choose_the_snapshot_directory_and_cadence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainguard.cli.common import CliError
    from trainguard.cli.incident import snapshots_of
    from trainguard.cli.main import build_parser

    monkeypatch.setenv("TRAINGUARD_STATE", str(tmp_path))
    parse = build_parser().parse_args
    snap = snapshots_of(parse(["incident", "serve"]), "tg")
    assert snap is not None and snap.store.directory == tmp_path / "incidents-tg-incidents"
    assert (snap.interval_s, snap.every_batches) == (30.0, 1000)
    snap = snapshots_of(parse(["incident", "serve", "--state-dir", str(tmp_path / "s"),
                               "--snapshot-interval-s", "2", "--snapshot-batches", "5",
                               "--group-id", "g"]), "tg")
    assert snap is not None and snap.store.directory == tmp_path / "s"
    assert (snap.interval_s, snap.every_batches) == (2.0, 5)
    assert snapshots_of(parse(["incident", "serve", "--no-snapshot"]), "tg") is None
    with pytest.raises(CliError, match="--snapshot-batches 0"):
        snapshots_of(parse(["incident", "serve", "--snapshot-batches", "0"]), "tg")
