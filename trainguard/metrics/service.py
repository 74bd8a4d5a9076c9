"""The pipeline-metrics service: every event topic read as one consumer group, on /metrics.

It reads through ``Bus.raw_source`` (bus/protocol.py: Kafka in production, in memory in unit
tests). Other groups' lag (``--watch-group-id``) needs the Kafka admin API: it is read only when
the source is a ``GroupLagSource`` (Kafka); on another bus those gauges stay unset.

It only reads: records that fail validation are counted, not dead-lettered (their own consumers
dead-letter them; doing it here too would count each twice). The dead-letter topic itself is
read as dead letters. Offsets are committed after each batch is applied (at-least-once; the
recorder drops redelivered event ids it still remembers).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from aiokafka.errors import KafkaError

from trainguard.bus.dlq import DeadLetter
from trainguard.bus.protocol import Bus, GroupLagSource, RawRecord, RecordSource
from trainguard.events.clock import now_us
from trainguard.events.codec import decode
from trainguard.events.envelope import Event
from trainguard.events.errors import ContractError
from trainguard.events.topics import EVENT_ROLES, TopicNames, TopicRole
from trainguard.metrics.recorder import Recorder

log = logging.getLogger(__name__)


class EventSink(Protocol):
    """What the exporter hands each fresh event to (the live traces)."""

    def __call__(self, event: Event) -> None: ...

    def tick(self) -> None:
        """Called after every poll: emit what has waited long enough."""

    def flush(self) -> None:
        """Called on stop: emit whatever still waits."""


@dataclass
class MetricsService:
    bus: Bus
    recorder: Recorder
    group_id: str
    from_offset: str = "latest"
    sinks: Sequence[EventSink] = ()
    watch_groups: Sequence[str] = ()
    lag_every_s: float = 2.0
    sweep_every_s: float = 60.0
    stopping: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.names: TopicNames = self.bus.names

    async def run(self) -> None:
        # the log and the dead letters; not the urgent copies (each is on its own topic too)
        source = self.bus.raw_source([*EVENT_ROLES, TopicRole.DLQ], group_id=self.group_id,
                                     name="trainguard-metrics", from_offset=self.from_offset)
        try:
            await source.start()
            await self._loop(source)
            self._on_sinks("flush")
        finally:
            await source.stop()

    async def _loop(self, source: RecordSource) -> None:
        next_lag = next_sweep = 0.0
        while not self.stopping.is_set():
            batch = await source.poll(timeout_ms=500, max_records=2000)
            for rec in batch:  # in partition order
                self._apply(self.names.role_of(rec.topic), rec)
            if batch:
                try:
                    await source.commit()
                except KafkaError as exc:  # a rebalance: redelivered events are deduplicated
                    log.warning("metrics: commit failed, batch may be redelivered: %s", exc)
            self._on_sinks("tick")
            now = time.monotonic()
            if now >= next_lag:
                await self._update_lag(source)
                await self._update_group_lag(source)
                next_lag = now + self.lag_every_s
            if now >= next_sweep:
                self.recorder.sweep(now_us())
                next_sweep = now + self.sweep_every_s

    def _apply(self, role: TopicRole, rec: RawRecord) -> None:
        raw = rec.value  # None: a tombstone, refused by decode like bad bytes
        if role is TopicRole.DLQ:
            try:
                letter = DeadLetter.decode(raw)
                self.recorder.dead_letter(letter, self.names)
            except (ValueError, TypeError):
                self.recorder.invalid(role.value)
            return
        try:
            event = decode(raw)
        except ContractError:
            self.recorder.invalid(role.value)
            return
        try:
            fresh = self.recorder.observe(event, role.value)
        except Exception as exc:  # a record the recorder cannot count must not stop it
            log.error("metrics: counting %s %s raised %s: %s; counted invalid", event.type,
                      event.event_id, type(exc).__name__, exc)
            log.debug("metrics: the traceback", exc_info=exc)
            self.recorder.invalid(role.value)
            return
        if fresh:
            for sink in self.sinks:
                try:
                    sink(event)
                except Exception:  # a trace that cannot be built must not stop the metrics
                    log.exception("metrics: sink %r failed on event %s", sink, event.event_id)

    def _on_sinks(self, what: Literal["tick", "flush"]) -> None:
        for sink in self.sinks:
            try:
                sink.tick() if what == "tick" else sink.flush()
            except Exception:  # a trace that cannot be built must not stop the metrics
                log.exception("metrics: sink %r failed on its %s", sink, what)

    async def _update_lag(self, source: RecordSource) -> None:
        lag: dict[str, int] = {}
        for topic, behind in (await source.lag()).items():
            role = self.names.role_of(topic).value
            lag[role] = lag.get(role, 0) + behind
        for role, behind in lag.items():
            self.recorder.metrics.consumer_lag.labels(role).set(behind)

    async def _update_group_lag(self, source: RecordSource) -> None:
        if not self.watch_groups or not isinstance(source, GroupLagSource):
            return
        try:
            lags = await source.group_lags(self.watch_groups)
        except KafkaError as exc:  # the next round tries again; the gauges keep their values
            log.warning("consumer group lag: %s", exc)
            return
        for (group, role), behind in lags.items():
            self.recorder.metrics.group_lag.labels(group, role).set(behind)
