"""Consuming events with validation at the edge.

A record that is not a valid event never reaches the caller and never stops the consumer: it is
written to the dead-letter topic with its reason, and only once that write is acknowledged is
its offset committed past. Valid records before and after it are delivered as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from trainguard.bus.config import KafkaConfig
from trainguard.bus.dlq import DeadLetter, dead_letter
from trainguard.bus.producer import EventProducer
from trainguard.events.clock import now_us
from trainguard.events.codec import decode
from trainguard.events.envelope import Event
from trainguard.events.errors import ContractError, FieldError
from trainguard.events.topics import TopicNames, TopicRole

log = logging.getLogger(__name__)
# Why a decoded event must not be believed (a signature that does not verify), or None.
Check = Callable[[Event], str | None]


@dataclass(frozen=True)
class Delivered:
    event: Event
    topic: str
    partition: int
    offset: int


@dataclass
class ConsumerStats:
    delivered: int = 0
    dead_lettered: int = 0


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
        check: Check | None = None,
        **settings: Any,
    ) -> None:
        self.names = names or TopicNames(config.topic_prefix)
        self.topics = [self.names.name(r) for r in roles]
        self.name = name
        self.stats = ConsumerStats()
        self._dlq = dlq
        self._check = check  # e.g. ``signing.Trust.check``: refused like a bad record
        self._dlq_topic = self.names.name(TopicRole.DLQ)
        self._consumer = AIOKafkaConsumer(
            *self.topics,
            **config.client_kwargs(),
            group_id=group_id,
            enable_auto_commit=False,
            auto_offset_reset=from_offset,
            isolation_level="read_committed",
            **settings,
        )

    async def start(self) -> None:
        await self._consumer.start()

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
            try:
                event = decode(rec.value)
            except ContractError as err:
                await self._dead_letter(err, rec)
                continue
            bad = self._check(event) if self._check is not None else None
            if bad is not None:
                sig = getattr(event.payload, "signature", None)
                await self._dead_letter(ContractError([FieldError("payload.signature", sig,
                                                                  bad)]), rec)
                continue
            good.append(Delivered(event, rec.topic, rec.partition, rec.offset))
        self.stats.delivered += len(good)
        return good

    async def _dead_letter(self, err: ContractError, rec: Any) -> DeadLetter:
        letter = dead_letter(
            err,
            topic=rec.topic,
            partition=rec.partition,
            offset=rec.offset,
            key=rec.key,
            value=rec.value if rec.value is not None else b"",
            rejected_at=now_us(),
            consumer=self.name,
        )
        if self._dlq is None:
            raise RuntimeError("a record was refused and this consumer has no dead-letter producer")
        await self._dlq.send_raw(self._dlq_topic, letter.encode(), key=rec.key)
        self.stats.dead_lettered += 1
        if self.stats.dead_lettered == 1 or self.stats.dead_lettered % 1000 == 0:
            log.warning("%s: dead-lettered %s:%s@%s: %s (total %d)", self.name, rec.topic,
                        rec.partition, rec.offset, letter.reason, self.stats.dead_lettered)
        return letter

    async def commit(self) -> None:
        await self._consumer.commit()

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
            if not batch and await self._caught_up():
                break
            out.extend(batch)
        return out

    async def _caught_up(self) -> bool:
        parts = self._consumer.assignment()
        if not parts:
            return False
        ends = await self._consumer.end_offsets(list(parts))
        for tp in parts:
            if await self._consumer.position(tp) < ends[tp]:
                return False
        return True
