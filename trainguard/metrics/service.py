"""The pipeline-metrics service: every event topic read as one consumer group, on /metrics.

It only reads: records that fail validation are counted, not dead-lettered (their own consumers
dead-letter them; doing it here too would count each twice). The dead-letter topic itself is
read as dead letters. Offsets are committed after each batch is applied (at-least-once; the
recorder drops redelivered event ids it still remembers).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from trainguard.bus.config import KafkaConfig
from trainguard.bus.dlq import DeadLetter
from trainguard.events.clock import now_us
from trainguard.events.codec import decode
from trainguard.events.envelope import Event
from trainguard.events.errors import ContractError
from trainguard.events.topics import TopicNames, TopicRole
from trainguard.metrics.group_lag import group_lags
from trainguard.metrics.recorder import Recorder

log = logging.getLogger(__name__)

EventSink = Callable[[Event], None]


@dataclass
class MetricsService:
    config: KafkaConfig
    recorder: Recorder
    group_id: str
    from_offset: str = "latest"
    sinks: Sequence[EventSink] = ()
    watch_groups: Sequence[str] = ()
    lag_every_s: float = 2.0
    sweep_every_s: float = 60.0
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.names = TopicNames(self.config.topic_prefix)

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(
            *self.names.all().values(), **self.config.client_kwargs(), group_id=self.group_id,
            enable_auto_commit=False, auto_offset_reset=self.from_offset,
            isolation_level="read_committed")
        admin = AIOKafkaAdminClient(**self.config.client_kwargs())
        try:
            await consumer.start()
            await admin.start()
            await self._loop(consumer, admin)
        finally:
            await admin.close()
            await consumer.stop()

    async def _loop(self, consumer: AIOKafkaConsumer, admin: AIOKafkaAdminClient) -> None:
        next_lag = next_sweep = 0.0
        while not self.stopping.is_set():
            batches = await consumer.getmany(timeout_ms=500, max_records=2000)
            for tp in sorted(batches, key=lambda t: (t.topic, t.partition)):
                role = self.names.role_of(tp.topic)
                for rec in batches[tp]:
                    self._apply(role, rec)
            if batches:
                try:
                    await consumer.commit()
                except KafkaError as exc:  # a rebalance: redelivered events are deduplicated
                    log.warning("metrics: commit failed, batch may be redelivered: %s", exc)
            now = time.monotonic()
            if now >= next_lag:
                await self._update_lag(consumer)
                await self._update_group_lag(consumer, admin)
                next_lag = now + self.lag_every_s
            if now >= next_sweep:
                self.recorder.sweep(now_us())
                next_sweep = now + self.sweep_every_s

    def _apply(self, role: TopicRole, rec: Any) -> None:
        raw: bytes = rec.value or b""
        if role is TopicRole.DLQ:
            try:
                letter = DeadLetter.decode(raw)
            except (ValueError, TypeError):
                self.recorder.invalid(role.value)
                return
            self.recorder.dead_letter(letter, self.names)
            return
        try:
            event = decode(raw)
        except ContractError:
            self.recorder.invalid(role.value)
            return
        if self.recorder.observe(event, role.value):
            for sink in self.sinks:
                try:
                    sink(event)
                except Exception:  # a trace that cannot be built must not stop the metrics
                    log.exception("metrics: sink %r failed on event %s", sink, event.event_id)

    async def _update_lag(self, consumer: AIOKafkaConsumer) -> None:
        parts = list(consumer.assignment())
        if not parts:
            return
        ends = await consumer.end_offsets(parts)
        lag: dict[str, int] = {}
        for tp in parts:
            role = self.names.role_of(tp.topic).value
            behind = max(0, ends[tp] - await consumer.position(tp))
            lag[role] = lag.get(role, 0) + behind
        for role, behind in lag.items():
            self.recorder.metrics.consumer_lag.labels(role).set(behind)

    async def _update_group_lag(self, consumer: AIOKafkaConsumer,
                                admin: AIOKafkaAdminClient) -> None:
        if not self.watch_groups:
            return
        try:
            lags = await group_lags(admin, consumer, self.names, self.watch_groups)
        except KafkaError as exc:  # the next round tries again; the gauges keep their values
            log.warning("consumer group lag: %s", exc)
            return
        for (group, role), behind in lags.items():
            self.recorder.metrics.group_lag.labels(group, role).set(behind)
