"""`trainguard alerts run`: incident transitions from the bus (a consumer group; Kafka in
production, ``bus/memory.py`` in unit tests) to every channel.

Offsets are committed only when nothing read is still held by the coalescer or waiting in a
channel's queue, so a restart re-reads what was not yet delivered (at least once); an incident
seen again from a later transition is taken as already opened (see ``coalesce``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trainguard.alerts.coalesce import Coalescer
from trainguard.alerts.config import AlertsConfig
from trainguard.alerts.delivery import ChannelWorker
from trainguard.alerts.http import AiohttpPoster, Poster
from trainguard.alerts.metrics import AlertMetrics
from trainguard.alerts.model import Notice, transition_from_event
from trainguard.bus.protocol import Bus, EventSource
from trainguard.events.topics import TopicRole

log = logging.getLogger(__name__)


@dataclass
class ServiceOptions:
    group_id: str
    from_offset: str = "latest"  # where a new group starts: no alerts for old history
    poll_ms: int = 200
    commit_every_s: float = 1.0
    drain_s: float = 10.0  # on stop, how long channels may take to deliver what is due


@dataclass
class AlertsService:
    config: AlertsConfig
    bus: Bus
    options: ServiceOptions
    metrics: AlertMetrics = field(default_factory=AlertMetrics)
    poster: Poster = field(default_factory=AiohttpPoster)
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        c = self.config.coalesce
        self.coalescer = Coalescer(hold_s=c.hold_s, retain_s=c.retain_s)
        self.workers = [
            ChannelWorker(b.channel, self.poster, redactor=self.config.redactor,
                          backoff=b.backoff, metrics=self.metrics, timeout_s=b.timeout_s)
            for b in self.config.channels]
        self._next_resend = {w.name: self.clock() + (w.policy.resend_s or 0)
                             for w in self.workers if w.policy.resend_s}

    async def run(self, stop: asyncio.Event) -> None:
        dlq = self.bus.producer()
        consumer = self.bus.consumer([TopicRole.INCIDENTS], group_id=self.options.group_id,
                                     name="trainguard-alerts", dlq=dlq,
                                     from_offset=self.options.from_offset)
        try:
            await dlq.start()
            await consumer.start()
        except BaseException:
            await consumer.stop()  # never leave a client of a failed start unclosed
            await dlq.stop()
            raise
        tasks = [asyncio.create_task(w.run(), name=f"alerts-{w.name}") for w in self.workers]
        try:
            await self._loop(consumer, stop)
            await self._drain(consumer)
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await consumer.stop()
            await dlq.stop()
            await self.poster.close()

    async def _loop(self, consumer: EventSource, stop: asyncio.Event) -> None:
        # Committed every second while nothing is held, records or not: a new group's
        # starting position ('latest') is then fixed at once, and a restart misses nothing.
        last_commit = self.clock()
        # Due notices leave at most once per flush_s: a storm spread over seconds is then a
        # few batches (digests), not one per poll.
        next_flush = self.clock()
        while not stop.is_set():
            batch = await consumer.poll(timeout_ms=self.options.poll_ms)
            now = self.clock()
            for delivered in batch:
                try:
                    t = transition_from_event(delivered.event)
                    if t is not None:
                        self.coalescer.offer(t, now)
                        self.metrics.transitions.inc()
                except Exception as exc:  # poison for the alerts: dead-lettered, carry on
                    await consumer.refuse(delivered, exc)
            if now >= next_flush:
                self._dispatch(self.coalescer.due(now))
                next_flush = now + self.config.coalesce.flush_s
            self._resend(now)
            self.metrics.incidents.set(self.coalescer.known())
            if now - last_commit >= self.options.commit_every_s and self._all_delivered():
                await self._commit(consumer)
                last_commit = now

    def _dispatch(self, notices: list[Notice]) -> None:
        if not notices:
            return
        for n in notices:
            self.metrics.notices.labels(n.kind.value).inc()
        for w in self.workers:
            w.submit(notices)

    def _resend(self, now: float) -> None:
        for w in self.workers:
            due = self._next_resend.get(w.name)
            if due is None or now < due or w.policy.resend_s is None:
                continue
            self._next_resend[w.name] = now + w.policy.resend_s
            w.submit(self.coalescer.firing())

    def _all_delivered(self) -> bool:
        return not self.coalescer.pending() and all(w.idle for w in self.workers)

    async def _commit(self, consumer: EventSource) -> None:
        try:
            await consumer.commit()
        except Exception as err:  # a rebalance: the next commit carries the offsets
            log.warning("alerts: commit failed (%s); will retry", type(err).__name__)

    async def _drain(self, consumer: EventSource) -> None:
        self._dispatch(self.coalescer.flush_all())
        deadline = self.clock() + self.options.drain_s
        while self.clock() < deadline and not self._all_delivered():
            await asyncio.sleep(0.05)
        if self._all_delivered():
            await self._commit(consumer)
        else:
            log.warning("alerts: stopping with undelivered messages; they are re-read at "
                        "the next start")
