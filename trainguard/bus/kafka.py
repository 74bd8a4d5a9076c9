"""The real bus: Kafka through the existing ``EventProducer`` and ``EventConsumer``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient

from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import Check, EventConsumer
from trainguard.bus.lease import KafkaLease
from trainguard.bus.producer import EventProducer, FencedProducer
from trainguard.bus.protocol import EventSink, EventSource, RawRecord
from trainguard.events.envelope import Event
from trainguard.events.topics import TopicNames, TopicRole


class KafkaBus:
    def __init__(self, config: KafkaConfig, **consumer_settings: Any) -> None:
        self.config = config
        self.names = TopicNames(config.topic_prefix)
        self._consumer_settings = consumer_settings

    def producer(self) -> EventProducer:
        return EventProducer(self.config, self.names)

    def consumer(self, roles: Sequence[TopicRole], *, group_id: str | None, name: str,
                 dlq: EventSink | None, from_offset: str = "earliest",
                 dedupe: bool = False, check: Check | None = None,
                 start_at: Mapping[tuple[str, int], int] | None = None) -> EventSource:
        if dlq is not None and not isinstance(dlq, EventProducer):
            raise TypeError(f"{name}: the dead-letter producer of a Kafka consumer is a Kafka "
                            f"producer (got {type(dlq).__name__})")
        return EventConsumer(self.config, roles, group_id=group_id, name=name, dlq=dlq,
                             names=self.names, from_offset=from_offset, dedupe=dedupe, check=check,
                             start_at=start_at, **self._consumer_settings)

    async def read(self, roles: Sequence[TopicRole]) -> list[Event]:
        from trainguard.incidents.source import read_topics  # the log source's reader

        return (await read_topics(self.config, roles)).events

    def raw_source(self, roles: Sequence[TopicRole], *, group_id: str | None, name: str,
                   from_offset: str = "earliest") -> KafkaRecordSource:
        return KafkaRecordSource(self.config, self.names, roles, group_id=group_id,
                                 from_offset=from_offset)

    def lease(self, role: TopicRole, *, group_id: str, name: str) -> KafkaLease:
        return KafkaLease(self.config, self.names.name(role), group_id=group_id, name=name)

    def fenced_producer(self, fence_id: str) -> FencedProducer:
        return FencedProducer(self.config, self.names, fence_id)


class KafkaRecordSource:
    """``Bus.raw_source`` on Kafka (read_committed, no auto-commit); also a ``GroupLagSource``:
    its admin client reads other groups' committed offsets."""

    def __init__(self, config: KafkaConfig, names: TopicNames, roles: Sequence[TopicRole], *,
                 group_id: str | None, from_offset: str = "earliest") -> None:
        self.config = config
        self.names = names
        self._consumer = AIOKafkaConsumer(
            *(names.name(r) for r in roles), **config.client_kwargs(), group_id=group_id,
            enable_auto_commit=False, auto_offset_reset=from_offset,
            isolation_level="read_committed")
        self._admin: AIOKafkaAdminClient | None = None

    async def start(self) -> None:
        await self._consumer.start()

    async def stop(self) -> None:
        try:
            if self._admin is not None:
                await self._admin.close()
                self._admin = None
        finally:
            await self._consumer.stop()

    async def poll(self, timeout_ms: int = 1000,
                   max_records: int | None = None) -> list[RawRecord]:
        batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        return [RawRecord(tp.topic, tp.partition, r.offset, r.key, r.value)
                for tp in sorted(batches, key=lambda t: (t.topic, t.partition))
                for r in batches[tp]]

    async def commit(self) -> None:
        await self._consumer.commit()

    async def lag(self) -> dict[str, int]:
        parts = list(self._consumer.assignment())
        if not parts:
            return {}
        ends = await self._consumer.end_offsets(parts)
        out: dict[str, int] = {}
        for tp in parts:
            behind = max(0, ends[tp] - await self._consumer.position(tp))
            out[tp.topic] = out.get(tp.topic, 0) + behind
        return out

    async def group_lags(self, groups: Sequence[str]) -> dict[tuple[str, str], int]:
        from trainguard.metrics.group_lag import group_lags

        if self._admin is None:
            admin = AIOKafkaAdminClient(**self.config.client_kwargs())
            await admin.start()
            self._admin = admin
        return await group_lags(self._admin, self._consumer, self.names, groups)
