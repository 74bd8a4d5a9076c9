"""Consuming events with validation at the edge.

A record that is not a valid event never reaches the caller and never stops the consumer: it is
written to the dead-letter topic with its reason, and only once that write is acknowledged is
its offset committed past. Valid records before and after it are delivered as usual. A null
value (a tombstone), empty or non-UTF-8 bytes, non-JSON, a JSON value that is not an event, an
unknown type, a bad field: all are refused by ``codec.decode`` with ``ContractError`` and
nothing else. A delivered record whose handling raises is the caller's to refuse
(``refuse``): dead-lettered with the exception as the reason, committed past like the others.
So restarting a consumer never replays a crash.

A consumer without a dead-letter producer (``dlq=None``: read-only tools, which must not write
a letter again at each run) skips such records, counts them (``stats.dead_lettered``) and logs
the first reason.

Duplicates (``dedupe``, for consumers that fold state): a record whose event id was delivered
already is skipped and counted (``stats.duplicates``). A producer that retries after a broker
failure writes the same bytes at two offsets, close together; the memory is bounded: the ids
of the last ``dedupe`` delivered events (``DEDUPE_IDS`` by default, about 100 bytes each), so a
copy more than that many records after its original is delivered again. Consumers that must
never act twice have their own guard on top (the actuator's ledger, decide's idempotency keys).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener

from trainguard.bus.config import KafkaConfig
from trainguard.bus.dlq import DeadLetter, dead_letter, refusal
from trainguard.bus.headers import spooled_us
from trainguard.bus.producer import EventProducer
from trainguard.events.clock import now_us
from trainguard.events.codec import decode
from trainguard.events.envelope import Event
from trainguard.events.errors import ContractError, FieldError
from trainguard.events.topics import TopicNames, TopicRole

log = logging.getLogger(__name__)
DEDUPE_IDS = 200_000  # event ids remembered by a deduplicating consumer (about 20 MB)
# Why a decoded event must not be believed (a signature that does not verify), or None.
Check = Callable[[Event], str | None]


@dataclass(frozen=True)
class Delivered:
    event: Event
    topic: str
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes = b""  # the record as read: what a dead letter keeps if handling it fails
    spooled_us: int = 0  # how long it waited in an agent's spool (its header, bus/headers.py)


@dataclass
class ConsumerStats:
    delivered: int = 0
    dead_lettered: int = 0
    duplicates: int = 0


class SeenIds:
    """The last ``capacity`` event ids, oldest forgotten first (insertion order)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"dedupe capacity: must be >= 1 (got {capacity})")
        self.capacity = capacity
        self._ids: dict[str, None] = {}

    def add(self, event_id: str) -> bool:
        """Remember ``event_id``; False if it was remembered already."""
        if event_id in self._ids:
            return False
        self._ids[event_id] = None
        if len(self._ids) > self.capacity:
            del self._ids[next(iter(self._ids))]
        return True

    def __len__(self) -> int:
        return len(self._ids)


class EventConsumer:
    """Reads event topics; yields only valid events; dead-letters the rest.

    ``group_id=None`` reads without a consumer group (replay, inspection) from ``from_offset``
    ('earliest' or 'latest'); with a group, offsets are committed explicitly by ``commit()``
    after the caller has handled a batch (at-least-once).
    """

    def __init__(
        self,
        config: KafkaConfig,
        roles: Sequence[TopicRole],
        *,
        group_id: str | None,
        name: str,
        dlq: EventProducer | None,
        names: TopicNames | None = None,
        from_offset: str = "earliest",
        dedupe: int | bool = False,
        check: Check | None = None,
        start_at: Mapping[tuple[str, int], int] | None = None,
        **settings: Any,
    ) -> None:
        self.names = names or TopicNames(config.topic_prefix)
        self.topics = [self.names.name(r) for r in roles]
        self.name = name
        self.stats = ConsumerStats()
        self._dlq = dlq
        self._check = check  # e.g. ``signing.Trust.check``: refused like a bad record
        self._dlq_topic = self.names.name(TopicRole.DLQ)
        self._seen = SeenIds(DEDUPE_IDS if dedupe is True else int(dedupe)) if dedupe else None
        self.uncommitted = False  # records read (delivered or refused) since the last commit
        self._group_id = group_id
        self._start_at = _StartAt(start_at or {})
        self._consumer = AIOKafkaConsumer(
            *self.topics,
            **config.client_kwargs(),
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset=from_offset,
            isolation_level="read_committed",
            **settings,
        )
        self._start_at.consumer = self._consumer
        if start_at and group_id is not None:  # applied when the group assigns a partition
            self._consumer.subscribe(self.topics, listener=self._start_at)

    async def start(self) -> None:
        try:
            await self._consumer.start()
            if self._start_at.offsets and self._group_id is None:  # assigned at start
                await self._start_at.on_partitions_assigned(self._consumer.assignment())
        except BaseException:
            await self._consumer.stop()  # a client that failed to start holds no connection
            raise

    async def stop(self) -> None:
        await self._consumer.stop()

    async def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[Delivered]:
        """One batch of valid events, in partition order; bad records are dead-lettered."""
        batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        out: list[Delivered] = []
        for tp in sorted(batches, key=lambda t: (t.topic, t.partition)):
            out.extend(await self._accept(tp, batches[tp]))
        return out

    async def _accept(self, tp: TopicPartition, records: Iterable[Any]) -> list[Delivered]:
        good: list[Delivered] = []
        for rec in records:
            self.uncommitted = True
            value = rec.value
            try:
                event = decode(value)
            except ContractError as err:
                await self._dead_letter(err, rec.topic, rec.partition, rec.offset, rec.key,
                                        value)
                continue
            bad = self._check(event) if self._check is not None else None
            if bad is not None:
                sig = getattr(event.payload, "signature", None)
                await self._dead_letter(ContractError([FieldError("payload.signature", sig,
                                                                  bad)]),
                                        rec.topic, rec.partition, rec.offset, rec.key, value)
                continue
            if self._seen is not None and not self._seen.add(event.event_id):
                self.stats.duplicates += 1
                continue
            good.append(Delivered(event, rec.topic, rec.partition, rec.offset, rec.key,
                                  bytes(value), spooled_us(rec.headers)))
        self.stats.delivered += len(good)
        return good

    async def refuse(self, item: Delivered, exc: BaseException) -> DeadLetter:
        """Dead-letter a delivered record whose handling raised ``exc`` (it is poison for
        this consumer): the letter names the exception; the caller commits past it as usual
        and carries on."""
        log.error("%s: handling %s %s (%s:%s@%s) raised %s: %s; dead-lettered", self.name,
                  item.event.type, item.event.event_id, item.topic, item.partition,
                  item.offset, type(exc).__name__, exc)
        log.debug("%s: the traceback", self.name, exc_info=exc)
        return await self._dead_letter(refusal(exc), item.topic, item.partition, item.offset,
                                       item.key, item.value)

    async def _dead_letter(self, err: ContractError, topic: str, partition: int, offset: int,
                           key: bytes | None, value: bytes | None) -> DeadLetter:
        letter = dead_letter(
            err,
            topic=topic,
            partition=partition,
            offset=offset,
            key=key,
            value=bytes(value) if value is not None else b"",
            rejected_at=now_us(),
            consumer=self.name,
        )
        self.stats.dead_lettered += 1
        first = self.stats.dead_lettered == 1 or self.stats.dead_lettered % 1000 == 0
        if self._dlq is None:  # a read-only consumer: skipped and counted, not written again
            if first:
                log.warning("%s: skipped %s:%s@%s: %s (total %d)", self.name, topic,
                            partition, offset, letter.reason, self.stats.dead_lettered)
            return letter
        await self._dlq.send_raw(self._dlq_topic, letter.encode(), key=key)
        if first:
            log.warning("%s: dead-lettered %s:%s@%s: %s (total %d)", self.name, topic,
                        partition, offset, letter.reason, self.stats.dead_lettered)
        return letter

    async def commit(self) -> None:
        """Commit every record read so far, refused ones included (call it once what was
        delivered has been handled)."""
        await self._consumer.commit()
        self.uncommitted = False

    async def end_offsets(self) -> dict[TopicPartition, int]:
        parts = list(self._consumer.assignment())
        result: dict[TopicPartition, int] = await self._consumer.end_offsets(parts)
        return result

    async def drain(self, *, idle_ms: int = 1500, limit_s: float = 30.0) -> list[Delivered]:
        """Everything up to now: poll until a poll comes back empty (bounded by ``limit_s``)."""
        import asyncio

        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        out: list[Delivered] = []
        while loop.time() < deadline:
            batch = await self.poll(timeout_ms=idle_ms)
            if not batch and await self.caught_up():
                break
            out.extend(batch)
        return out

    async def positions(self) -> dict[tuple[str, int], int]:
        return {(tp.topic, tp.partition): await self._consumer.position(tp)
                for tp in sorted(self._consumer.assignment(),
                                 key=lambda t: (t.topic, t.partition))}

    async def caught_up(self) -> bool:
        parts = self._consumer.assignment()
        if not parts:
            return False
        ends = await self._consumer.end_offsets(list(parts))
        for tp in parts:
            if await self._consumer.position(tp) < ends[tp]:
                return False
        return True


class _StartAt(ConsumerRebalanceListener):  # type: ignore[misc]
    """Seeks each partition named in ``offsets`` there when it is first assigned (a position
    past the end is reset as ``auto_offset_reset`` says)."""

    def __init__(self, offsets: Mapping[tuple[str, int], int]) -> None:
        self.offsets = dict(offsets)
        self.consumer: AIOKafkaConsumer | None = None

    async def on_partitions_revoked(self, revoked: Any) -> None:
        return None

    async def on_partitions_assigned(self, assigned: Any) -> None:
        if self.consumer is None:
            return
        for tp in assigned:
            offset = self.offsets.pop((tp.topic, tp.partition), None)
            if offset is not None:
                self.consumer.seek(tp, offset)
