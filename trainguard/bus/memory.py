"""The bus in memory, for unit tests of services: the semantics of ``bus/protocol.py`` without a
broker. Topics are the registry's, with their partitions; a record's partition is a stable hash
of its key (one job stays on one partition, in order); offsets count per partition; consumer
groups commit positions; a record that is not a valid event is dead-lettered (the same
``DeadLetter`` bytes as on Kafka) and reading carries on.

Single event loop, no threads: every method is a coroutine only to keep the Protocol's shape.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainguard.bus.consumer import DEDUPE_IDS, Check, ConsumerStats, Delivered, SeenIds
from trainguard.bus.dlq import dead_letter, refusal
from trainguard.bus.errors import Fenced
from trainguard.bus.producer import stamp_ingest
from trainguard.bus.protocol import EventSink, RawRecord
from trainguard.events.clock import now_us
from trainguard.events.codec import decode, encode, partition_key
from trainguard.events.envelope import Event
from trainguard.events.errors import ContractError, FieldError
from trainguard.events.registry import BY_NAME
from trainguard.events.topics import TOPIC_SPECS, TopicNames, TopicRole

log = logging.getLogger(__name__)
POLL_STEP_S = 0.002  # how often an empty poll looks again until its timeout


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes | None
    timestamp_ms: int | None = None


@dataclass(frozen=True)
class RecordMetadata:
    topic: str
    partition: int
    offset: int


class UnknownTopicError(KeyError):
    """A topic this bus does not hold (Kafka: UnknownTopicOrPartition)."""


class MemoryBus:
    def __init__(self, prefix: str = "tg", partitions: int | None = None) -> None:
        """The registry's topics under ``prefix``; ``partitions`` overrides every count."""
        self.names = TopicNames(prefix)
        self.topics: dict[str, list[list[Record]]] = {
            self.names.name(s.role): [[] for _ in range(partitions or s.partitions)]
            for s in TOPIC_SPECS}
        self.committed: dict[tuple[str, str, int], int] = {}  # (group, topic, partition)
        self._spread = itertools.count()  # records without a key go round the partitions
        self.groups: dict[tuple[str, str], list[MemoryLease]] = {}  # (group, topic): members
        self.fences: dict[str, int] = {}  # fence id -> the epoch of its newest producer

    # --- the log ----------------------------------------------------------------------------

    def partitions(self, topic: str) -> list[list[Record]]:
        try:
            return self.topics[topic]
        except KeyError:
            raise UnknownTopicError(topic) from None

    def partition_for(self, topic: str, key: bytes | None) -> int:
        n = len(self.partitions(topic))
        return (zlib.crc32(key) if key is not None else next(self._spread)) % n

    def append(self, topic: str, record: Record) -> RecordMetadata:
        partition = self.partition_for(topic, record.key)
        log_ = self.partitions(topic)[partition]
        log_.append(record)
        return RecordMetadata(topic, partition, len(log_) - 1)

    def records(self, role: TopicRole) -> list[Record]:
        """Every record of a topic, partition by partition (for tests)."""
        return [r for part in self.partitions(self.names.name(role)) for r in part]

    def events(self, role: TopicRole) -> list[Event]:
        """Every valid event of a topic, partition by partition (for tests)."""
        out: list[Event] = []
        for rec in self.records(role):
            try:
                out.append(_decode(rec.value))
            except ContractError:
                continue
        return out

    async def publish(self, events: Sequence[Event]) -> None:
        """Send ``events`` through a producer, in order, as a writer would (for tests)."""
        prod = self.producer()
        await prod.start()
        try:
            for e in events:
                await prod.send(e)
        finally:
            await prod.stop()

    def end_offset(self, roles: Sequence[TopicRole]) -> int:
        """How many records the topics of ``roles`` hold, all partitions (for tests)."""
        return sum(len(part) for role in roles for part in self.partitions(self.names.name(role)))

    def committed_offset(self, group: str, roles: Sequence[TopicRole]) -> int:
        """The offsets ``group`` committed on the topics of ``roles``, summed (for tests): equal
        to ``end_offset`` once the group committed everything."""
        topics = {self.names.name(role) for role in roles}
        return sum(o for (g, t, _), o in self.committed.items() if g == group and t in topics)

    # --- the Protocol -----------------------------------------------------------------------

    def producer(self) -> MemoryProducer:
        return MemoryProducer(self)

    def consumer(self, roles: Sequence[TopicRole], *, group_id: str | None, name: str,
                 dlq: EventSink | None, from_offset: str = "earliest",
                 dedupe: bool = False, check: Check | None = None,
                 start_at: Mapping[tuple[str, int], int] | None = None) -> MemoryConsumer:
        return MemoryConsumer(self, roles, group_id=group_id, name=name, dlq=dlq,
                              from_offset=from_offset, dedupe=dedupe, check=check,
                              start_at=start_at)

    async def read(self, roles: Sequence[TopicRole]) -> list[Event]:
        return [e for role in roles for e in self.events(role)]

    def raw_source(self, roles: Sequence[TopicRole], *, group_id: str | None, name: str,
                   from_offset: str = "earliest") -> MemoryRecordSource:
        return MemoryRecordSource(self, roles, group_id=group_id, name=name,
                                  from_offset=from_offset)

    def lease(self, role: TopicRole, *, group_id: str, name: str) -> MemoryLease:
        return MemoryLease(self, self.names.name(role), group_id=group_id, name=name)

    def fenced_producer(self, fence_id: str) -> MemoryFencedProducer:
        return MemoryFencedProducer(self, fence_id)

    def expire(self, lease: MemoryLease) -> None:
        """The group's session of ``lease`` times out (its process was killed or paused): the
        others take its partitions over, while it, if it still runs, believes it holds them."""
        lease._zombie = lease.held()
        self.groups[(lease.group_id, lease.topic)].remove(lease)


class MemoryProducer:
    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus
        self.started = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    def _append(self, topic: str, record: Record) -> RecordMetadata:
        if not self.started:
            raise RuntimeError("producer: send before start()")
        return self.bus.append(topic, record)

    async def send(self, event: Event) -> RecordMetadata:
        event = stamp_ingest(event, now_us())
        record = Record(partition_key(event), encode(event), event.event_time // 1000)
        meta = self._append(self.bus.names.name(BY_NAME[event.type].topic), record)
        for copy in BY_NAME[event.type].topics[1:]:  # an urgent type's copy, as on Kafka
            self._append(self.bus.names.name(copy), record)
        return meta

    async def enqueue(self, event: Event) -> asyncio.Future[RecordMetadata]:
        fut: asyncio.Future[RecordMetadata] = asyncio.get_running_loop().create_future()
        fut.set_result(await self.send(event))
        return fut

    async def send_raw(self, topic: str, value: bytes, key: bytes | None = None
                       ) -> RecordMetadata:
        return self._append(topic, Record(key, value))

    async def flush(self) -> None:
        return None


class MemoryFencedProducer(MemoryProducer):
    """``Bus.fenced_producer`` in memory: each start takes the fence id's next epoch; a send
    from an older epoch raises ``Fenced`` and appends nothing."""

    def __init__(self, bus: MemoryBus, fence_id: str) -> None:
        super().__init__(bus)
        self.fence_id = fence_id
        self.epoch = 0

    async def start(self) -> None:
        self.epoch = self.bus.fences[self.fence_id] = self.bus.fences.get(self.fence_id, 0) + 1
        await super().start()

    def _append(self, topic: str, record: Record) -> RecordMetadata:
        if self.bus.fences.get(self.fence_id) != self.epoch:
            raise Fenced(f"{self.fence_id}: a newer producer took this fence id over")
        return super()._append(topic, record)


class MemoryConsumer:
    def __init__(self, bus: MemoryBus, roles: Sequence[TopicRole], *, group_id: str | None,
                 name: str, dlq: EventSink | None, from_offset: str = "earliest",
                 dedupe: bool = False, check: Check | None = None,
                 start_at: Mapping[tuple[str, int], int] | None = None) -> None:
        if from_offset not in ("earliest", "latest"):
            raise ValueError(f"from_offset: 'earliest' or 'latest' (got {from_offset!r})")
        self.bus = bus
        self.topics = [bus.names.name(r) for r in roles]
        for topic in self.topics:
            bus.partitions(topic)  # unknown topics fail here, as subscribing would
        self.group_id = group_id
        self.name = name
        self.stats = ConsumerStats()
        self._dlq = dlq
        self._dlq_topic = bus.names.name(TopicRole.DLQ)
        self._from = from_offset
        self._positions: dict[tuple[str, int], int] | None = None
        self._seen = SeenIds(DEDUPE_IDS) if dedupe else None
        self._check = check
        self._start_at = dict(start_at or {})
        self.uncommitted = False

    async def start(self) -> None:
        positions: dict[tuple[str, int], int] = {}
        for topic in self.topics:
            for partition, log_ in enumerate(self.bus.partitions(topic)):
                committed = (self.bus.committed.get((self.group_id, topic, partition))
                             if self.group_id is not None else None)
                positions[(topic, partition)] = committed if committed is not None else (
                    0 if self._from == "earliest" else len(log_))
                at = self._start_at.pop((topic, partition), None)
                if at is not None:  # Kafka: a position past the end is reset (from_offset)
                    positions[(topic, partition)] = at if 0 <= at <= len(log_) else (
                        0 if self._from == "earliest" else len(log_))
        self._positions = positions

    async def stop(self) -> None:
        self._positions = None

    def _pos(self) -> dict[tuple[str, int], int]:
        if self._positions is None:
            raise RuntimeError(f"{self.name}: consumer not started")
        return self._positions

    async def poll(self, timeout_ms: int = 1000,
                   max_records: int | None = None) -> list[Delivered]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            taken = self._take(max_records)
            if taken:
                return await self._accept(taken)
            if loop.time() >= deadline:
                return []
            await asyncio.sleep(min(POLL_STEP_S, max(0.0, deadline - loop.time())))

    def _take(self, max_records: int | None) -> list[tuple[str, int, int, Record]]:
        pos = self._pos()
        out: list[tuple[str, int, int, Record]] = []
        for topic, partition in sorted(pos):
            log_ = self.bus.partitions(topic)[partition]
            start = pos[(topic, partition)]
            end = len(log_) if max_records is None else min(
                len(log_), start + max_records - len(out))
            out.extend((topic, partition, off, log_[off]) for off in range(start, end))
            pos[(topic, partition)] = max(start, end)
            if max_records is not None and len(out) >= max_records:
                break
        return out

    async def _accept(self, taken: list[tuple[str, int, int, Record]]) -> list[Delivered]:
        good: list[Delivered] = []
        for topic, partition, offset, rec in taken:
            self.uncommitted = True
            try:
                event = _decode(rec.value)
            except ContractError as err:
                await self._dead_letter(err, topic, partition, offset, rec)
                continue
            bad = self._check(event) if self._check is not None else None
            if bad is not None:
                await self._dead_letter(ContractError([FieldError(
                    "payload.signature", getattr(event.payload, "signature", None), bad)]),
                    topic, partition, offset, rec)
                continue
            if self._seen is not None and not self._seen.add(event.event_id):
                self.stats.duplicates += 1
                continue
            good.append(Delivered(event, topic, partition, offset, rec.key, rec.value or b""))
        self.stats.delivered += len(good)
        return good

    async def _dead_letter(self, err: ContractError, topic: str, partition: int, offset: int,
                           rec: Record) -> None:
        if self._dlq is None:  # a reader without a dead-letter producer skips and counts
            self.stats.dead_lettered += 1
            log.warning("%s: skipped %s:%s@%s: %s", self.name, topic, partition, offset, err)
            return
        letter = dead_letter(err, topic=topic, partition=partition, offset=offset,
                             key=rec.key, value=rec.value or b"", rejected_at=now_us(),
                             consumer=self.name)
        await self._dlq.send_raw(self._dlq_topic, letter.encode(), key=rec.key)
        self.stats.dead_lettered += 1
        log.warning("%s: dead-lettered %s:%s@%s: %s", self.name, topic, partition, offset,
                    letter.reason)

    async def refuse(self, item: Delivered, exc: BaseException) -> None:
        """Dead-letter a delivered record whose handling raised (as EventConsumer.refuse)."""
        await self._dead_letter(refusal(exc), item.topic, item.partition, item.offset,
                                Record(item.key, item.value))

    async def commit(self) -> None:
        if self.group_id is None:
            raise RuntimeError(f"{self.name}: commit() needs a consumer group")
        for (topic, partition), offset in self._pos().items():
            self.bus.committed[(self.group_id, topic, partition)] = offset
        self.uncommitted = False

    async def drain(self, *, idle_ms: int = 1500, limit_s: float = 30.0) -> list[Delivered]:
        """Everything up to the end now (in memory the end is known: no idle wait)."""
        out: list[Delivered] = []
        while self._take_pending():
            out.extend(await self._accept(self._take(None)))
        return out

    async def caught_up(self) -> bool:
        return not self._take_pending()

    async def positions(self) -> dict[tuple[str, int], int]:
        return dict(self._pos())

    def _take_pending(self) -> bool:
        return any(pos < len(self.bus.partitions(t)[p]) for (t, p), pos in self._pos().items())


class MemoryRecordSource:
    """``Bus.raw_source`` in memory: the positions and commits of ``MemoryConsumer``, the records
    as they are."""

    def __init__(self, bus: MemoryBus, roles: Sequence[TopicRole], *, group_id: str | None,
                 name: str, from_offset: str = "earliest") -> None:
        self._reader = MemoryConsumer(bus, roles, group_id=group_id, name=name, dlq=None,
                                      from_offset=from_offset)
        self.bus = bus
        self.name = name

    async def start(self) -> None:
        await self._reader.start()

    async def stop(self) -> None:
        await self._reader.stop()

    async def poll(self, timeout_ms: int = 1000,
                   max_records: int | None = None) -> list[RawRecord]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while True:
            taken = self._reader._take(max_records)
            if taken:
                return [RawRecord(t, p, o, r.key, r.value) for t, p, o, r in taken]
            if loop.time() >= deadline:
                return []
            await asyncio.sleep(min(POLL_STEP_S, max(0.0, deadline - loop.time())))

    async def commit(self) -> None:
        await self._reader.commit()

    async def lag(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for (topic, partition), pos in self._reader._pos().items():
            end = len(self.bus.partitions(topic)[partition])
            out[topic] = out.get(topic, 0) + max(0, end - pos)
        return out


def _decode(value: bytes | None) -> Event:
    if value is None:
        raise ContractError([FieldError("value", None, "a null value (tombstone) is not an "
                                                       "event")])
    return decode(value)


class MemoryLease:
    """``Bus.lease`` in memory: the group's live members in the order they joined; partition p
    is held by member p mod (members), as Kafka's round-robin assignor spreads one topic."""

    def __init__(self, bus: MemoryBus, topic: str, *, group_id: str, name: str) -> None:
        bus.partitions(topic)  # unknown topics fail here, as subscribing would
        self.bus = bus
        self.topic = topic
        self.group_id = group_id
        self.name = name
        self._zombie: frozenset[int] | None = None

    def _members(self) -> list[MemoryLease]:
        return self.bus.groups.setdefault((self.group_id, self.topic), [])

    async def start(self) -> None:
        self._members().append(self)

    async def stop(self) -> None:
        members = self._members()
        if self in members:
            members.remove(self)
        self._zombie = frozenset()

    def held(self) -> frozenset[int]:
        if self._zombie is not None:
            return self._zombie
        members = self._members()
        if self not in members:
            return frozenset()
        me, n = members.index(self), len(members)
        return frozenset(p for p in range(len(self.bus.partitions(self.topic))) if p % n == me)

    def holds(self, key: bytes) -> bool:
        return self.partition(key) in self.held()

    def partition(self, key: bytes) -> int | None:
        return self.bus.partition_for(self.topic, key)
