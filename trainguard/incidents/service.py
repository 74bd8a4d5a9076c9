"""`trainguard incident serve`: the log's topics in, incident transitions out.

Start: the incidents topic is read to learn which transitions are already published. With a
snapshot (``Snapshots``: the fold's state and the consumer offsets it covers, written after a
commit every ``interval_s`` or ``every_batches`` batches, and at a clean stop) that is of this
log and this fold, the state is put back and the consumer starts at the snapshot's offsets.
Without one (none yet, unreadable, corrupt, another version or another log: said in one line),
the input topics are read from the beginning to their end and folded in event-time order to
rebuild every incident (the state is the log; the snapshot is only a shortcut), and the missing
transitions are published. Either way the result is the same. Then a consumer group
follows the topics; each batch's transitions are published (acks=all) before its offsets are
committed. A restart publishes nothing twice: transition ids are derived from the incident and
its sequence number, and ids already on the topic are skipped (consumers dedupe by id anyway).
When the log is quiet for ``idle_flush_s`` and the consumer has read everything now on its
partitions, the reorder buffer is flushed so the tail of a finished job is decided too. Quiet
alone is not enough: after an outage (or under load) a poll can come back empty while another
topic's records are still unread, and a flush then would fold a verdict's resolve before the
command it followed and publish a transition the log does not make (a 2026-12-06 CI run did).
When the consumer cannot tell (the broker is away), the buffer is flushed after
``unread_flush_s`` of quiet anyway. Records that come behind the watermark (after an outage)
are folded in their place by the same rule: once ``idle_flush_s`` has passed since the first
of them and everything on the partitions is read (or ``unread_flush_s`` has passed). Folding
them at once would publish a fold of whatever part of the late records the last poll happened
to bring: a verdict's resolve read from its topic before the migrate command on another
(another 2026-12-06 CI run did). Meanwhile the job's transitions wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from trainguard.bus.consumer import Check
from trainguard.bus.protocol import Bus, EventSource
from trainguard.events.envelope import Event
from trainguard.events.topics import TopicRole
from trainguard.incidents.live import LiveIncidents
from trainguard.incidents.query import canonical
from trainguard.incidents.settings import IncidentSettings
from trainguard.incidents.snapshot import (
    Offsets,
    Snapshot,
    SnapshotStore,
    encode_snapshot,
    identity_problem,
)
from trainguard.incidents.source import order
from trainguard.incidents.state_codec import SnapshotError

log = logging.getLogger(__name__)
INPUT_ROLES = (TopicRole.TASK, TopicRole.VERDICTS, TopicRole.COMMANDS, TopicRole.OUTCOMES)


@dataclass
class ServiceStats:
    consumed: int = 0
    published: int = 0
    already_published: int = 0
    # an id already on the topic with other content: a record came later than the lateness
    # bound before (the published one stays; `trainguard replay` lists the difference)
    conflicts: int = 0
    batches: int = 0
    restored: bool = False  # started from a snapshot (else rebuilt from the log)
    snapshots: int = 0  # snapshots written
    following: bool = False  # the state is rebuilt or restored and the consumer is started


@dataclass(frozen=True)
class Snapshots:
    """Where and how often the fold's state is written (after a commit, when ``interval_s``
    have passed or ``every_batches`` batches were folded since the last one)."""

    store: SnapshotStore
    interval_s: float = 30.0
    every_batches: int = 1000

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.every_batches < 1:
            raise ValueError(f"snapshots: interval_s > 0 and every_batches >= 1 (got "
                             f"{self.interval_s}, {self.every_batches})")


class Sender(Protocol):
    async def enqueue(self, event: Event) -> Any:
        """Hand the event to the producer; the returned future resolves on the broker's ack."""
        ...


class Publisher:
    """Publishes transitions once: ids seen on the incidents topic or sent here are skipped."""

    def __init__(self, producer: Sender, known: dict[str, bytes],
                 stats: ServiceStats) -> None:
        self.producer = producer
        self.known = known  # event id -> canonical bytes
        self.stats = stats

    async def publish(self, transitions: list[Event]) -> None:
        futures = []
        for t in transitions:
            mine = canonical(t)
            theirs = self.known.get(t.event_id)
            if theirs is not None:
                self.stats.already_published += 1
                if theirs != mine:
                    self.stats.conflicts += 1
                    log.warning("incidents: transition %s differs from the one published "
                                "(a record arrived later than the lateness bound); the "
                                "published one stays", t.event_id)
                continue
            futures.append(await self.producer.enqueue(t))
            self.known[t.event_id] = mine
        for fut in futures:
            await fut  # acknowledged (acks=all) before the caller commits its offsets
        self.stats.published += len(futures)


UNREAD_FLUSH_S = 30.0
CAUGHT_UP_TIMEOUT_S = 2.0


async def _read_all(consumer: EventSource) -> bool:
    """Whether the consumer has read everything now on its partitions; False when it cannot
    tell (the broker away or slow to answer)."""
    try:
        return await asyncio.wait_for(consumer.caught_up(), CAUGHT_UP_TIMEOUT_S)
    except Exception as exc:  # any failure to ask is "cannot tell"
        log.debug("incidents: cannot tell whether everything was read: %s", exc)
        return False


async def serve(bus: Bus, *, settings: IncidentSettings | None = None,
                group: str | None = None, idle_flush_s: float = 5.0,
                unread_flush_s: float = UNREAD_FLUSH_S,
                stop: asyncio.Event | None = None, stats: ServiceStats | None = None,
                check: Check | None = None, live: LiveIncidents | None = None,
                observe: Callable[[Event], None] | None = None,
                snapshots: Snapshots | None = None, poll_ms: int = 500) -> ServiceStats:
    """``check`` (``signing.Trust.check``): commands, outcomes and pool events are folded only
    when their signature verifies; the others are dead-lettered by the consumer and left out
    of the history read at start. None: nothing is checked (in-process tests).

    ``live``: the fold to use (the served pages read it); ``observe``: called with every
    accepted input event, history and live, before it is folded (the pages' event context;
    after a restart from a snapshot, the events since the snapshot only).

    ``snapshots``: where the state is written and read back (None: never; every start
    rebuilds from the log). ``poll_ms``: how long one poll waits for records.
    ``idle_flush_s``/``unread_flush_s``: see the module's text."""
    stats = stats or ServiceStats()
    stop = stop or asyncio.Event()
    live = live if live is not None else LiveIncidents(settings)
    seen = observe or (lambda _ev: None)
    group_id = group or f"{bus.names.prefix}-incidents"
    known = {e.event_id: canonical(e) for e in await bus.read([TopicRole.INCIDENTS])
             if e.type == "incident.transition"}
    identity = _identity(bus, group_id, live)
    start_at = _restore(snapshots, identity, live, known) if snapshots is not None else None
    stats.restored = start_at is not None
    producer = bus.producer()
    await producer.start()
    consumer = bus.consumer(INPUT_ROLES, group_id=group_id, name="incidents", dlq=producer,
                            from_offset="earliest", check=check, start_at=start_at)
    loop = asyncio.get_running_loop()
    try:
        publisher = Publisher(producer, known, stats)

        async def settled(since: float) -> bool:
            quiet = loop.time() - since
            return quiet >= idle_flush_s and (quiet >= unread_flush_s
                                              or await _read_all(consumer))

        if start_at is None:
            await _rebuild(bus, live, publisher, stats, check, seen)
        await consumer.start()
        stats.following = True
        last_input = saved_at = loop.time()
        late_since: float | None = None  # when a record first came behind the watermark
        unsaved = 0  # batches folded (and flushes) since the last snapshot
        while not stop.is_set():
            batch = await consumer.poll(timeout_ms=poll_ms)
            out = []
            by_id = {item.event.event_id: item for item in batch}
            for ev in order(item.event for item in batch):  # a batch spans partitions
                seen(ev)
                try:
                    out += live.feed(ev)
                except Exception as exc:  # poison for the fold: dead-lettered, carry on
                    await consumer.refuse(by_id[ev.event_id], exc)
            now = loop.time()
            if batch:
                last_input = now
            if live.dirty and late_since is None:
                late_since = now
            try:
                if not batch and live.buffered and await settled(last_input):
                    out += live.flush()  # with the late records in their place
                    unsaved += 1  # the state moved: the next snapshot has it
                elif late_since is not None and await settled(late_since):
                    out += live.catch_up()  # records that came behind the watermark
                if not live.dirty:
                    late_since = None
            except SnapshotError as exc:  # a restored record the codec no longer reads
                _set_aside(snapshots)
                raise SnapshotError(f"incidents: {exc}; the snapshot is set aside, the next "
                                    "start rebuilds from the log") from None
            await publisher.publish(out)
            if consumer.uncommitted:  # refused records too: a restart does not read them
                await consumer.commit()
            if batch:
                stats.consumed += len(batch)
                stats.batches += 1
                unsaved += 1
            if snapshots is not None and unsaved and (
                    unsaved >= snapshots.every_batches
                    or loop.time() - saved_at >= snapshots.interval_s):
                await _save(snapshots, identity, live, consumer, stats)
                unsaved, saved_at = 0, loop.time()
        if snapshots is not None and unsaved:  # a clean stop: the next start reads on from here
            await _save(snapshots, identity, live, consumer, stats)
    finally:
        await consumer.stop()
        await producer.stop()
    return stats


async def _rebuild(bus: Bus, live: LiveIncidents, publisher: Publisher, stats: ServiceStats,
                   check: Check | None, seen: Callable[[Event], None]) -> None:
    """Every input topic from the beginning, folded in event-time order."""
    history = await bus.read(INPUT_ROLES)
    if check is not None:
        history = [e for e in history if check(e) is None]
    out: list[Event] = []
    # topic by topic is not an arrival order within any lateness: time order is
    for ev in order(history):
        seen(ev)
        try:
            out += live.feed(ev)
        except Exception as exc:  # the live consumer below dead-letters it
            log.error("incidents: folding %s %s raised %s: %s; left out", ev.type,
                      ev.event_id, type(exc).__name__, exc)
            log.debug("incidents: the traceback", exc_info=exc)
    out += live.catch_up()
    stats.consumed += len(history)
    await publisher.publish(out)
    log.info("incidents: rebuilt from %d events, %d transitions known",
             len(history), len(publisher.known))


def _set_aside(snapshots: Snapshots | None) -> None:
    """Move the snapshot out of the way (kept beside it for a look): a restart must not load
    it again."""
    if snapshots is None:
        return
    path = snapshots.store.path
    with contextlib.suppress(OSError):
        path.replace(path.with_name(path.name + ".unusable"))


def _identity(bus: Bus, group_id: str, live: LiveIncidents) -> dict[str, Any]:
    """What a snapshot must have been taken of to be used here."""
    settings = {k: (v.value if hasattr(v, "value") else v)
                for k, v in dataclasses.asdict(live.settings).items()}
    return {"prefix": bus.names.prefix, "group_id": group_id, "settings": settings,
            "history_max": live.history_max, "inputs": [str(r) for r in INPUT_ROLES]}


def _restore(snapshots: Snapshots, identity: dict[str, Any], live: LiveIncidents,
             known: dict[str, bytes]) -> Offsets | None:
    """The offsets to read on from, with ``live`` restored; None (said in one line): rebuild."""
    where = snapshots.store.path
    collecting = gc.isenabled()
    gc.disable()  # a restore allocates millions of objects and frees none: no cycles to find
    try:
        snap = snapshots.store.read()
        if snap is None:
            log.info("incidents: no snapshot at %s; rebuilding from the log", where)
            return None
        problem = identity_problem(snap.identity, identity)
        if problem is not None:
            raise SnapshotError(problem)
        if not snap.offsets:
            raise SnapshotError("offsets: none")
        missing = [i for job in snap.state.get("jobs", {}).values()
                   for i in job.get("emitted", {}) if i not in known]
        if missing:  # not this log (a new broker, a deleted topic): its offsets mean nothing
            raise SnapshotError(f"emitted: {len(missing)} transition(s) not on the incidents "
                                f"topic (e.g. {missing[0]}): a snapshot of another log")
        live.restore(snap.state)
    except SnapshotError as exc:
        log.warning("incidents: snapshot %s not used (%s); rebuilding from the log", where, exc)
        return None
    except Exception as exc:  # whatever else: never a crash, never a crash loop
        log.warning("incidents: snapshot %s not used (%s: %s); rebuilding from the log", where,
                    type(exc).__name__, exc)
        return None
    finally:
        if collecting:
            gc.enable()
    log.info("incidents: restored from %s (%d partitions' offsets, %d jobs)", where,
             len(snap.offsets), len(snap.state.get("jobs", {})))
    return snap.offsets


async def _save(snapshots: Snapshots, identity: dict[str, Any], live: LiveIncidents,
                consumer: EventSource, stats: ServiceStats) -> None:
    """The state and the offsets it covers (taken together, after a commit); a failed write
    is logged and the service goes on (the next start rebuilds or uses an older one)."""
    try:
        data = encode_snapshot(Snapshot(identity, await consumer.positions(), live.snapshot()))
        await asyncio.to_thread(snapshots.store.write, data)
    except Exception as exc:
        log.error("incidents: writing the snapshot %s failed (%s: %s); going on",
                  snapshots.store.path, type(exc).__name__, exc)
        return
    stats.snapshots += 1
