"""`trainguard decide`: the decision service, the only holder of the command signing key.

It reads verdicts, commands, outcomes (with the pool) and checkpoint events, folds them through
the pure policy (``policy.py``), and publishes each decision as a signed ``command``. At start
it reads every topic from the beginning to rebuild its state; decisions derived during that
catch-up are published only if their idempotency key is not already on the commands topic, so
a restarted service does not repeat itself.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from trainguard.actuators import metrics, policy, signing
from trainguard.actuators.policy import Decision, PolicyConfig, PolicyState
from trainguard.bus.consumer import Delivered
from trainguard.bus.protocol import Bus, EventSink, EventSource
from trainguard.events.clock import now_us
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event
from trainguard.events.ids import derived_id
from trainguard.events.payloads import Command, Verdict
from trainguard.events.topics import TopicRole

log = logging.getLogger(__name__)
SOURCE = "trainguard-decide"
ROLES = (TopicRole.COMMANDS, TopicRole.OUTCOMES, TopicRole.VERDICTS, TopicRole.TASK)
INPUT_TYPES = frozenset({"verdict", "command", "command.outcome", "pool.unit", "checkpoint"})


@dataclass(frozen=True)
class DeciderOptions:
    key: bytes
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    tick_s: float = 0.25
    jobs: frozenset[str] | None = None  # None: every job


class Decider:
    def __init__(self, bus: Bus, opts: DeciderOptions) -> None:
        self.bus = bus  # Kafka (``KafkaBus``), or the in-memory twin in unit tests
        self.opts = opts
        self.state = PolicyState()
        self.producer: EventSink | None = None  # made inside the running loop

    def _wanted(self, event: Event) -> bool:
        return event.type in INPUT_TYPES and (self.opts.jobs is None
                                              or event.job_id in self.opts.jobs)

    def feed(self, event: Event, now: int) -> list[Decision]:
        self.state, out = policy.step(self.state, event, now, self.opts.policy)
        return out

    async def _guarded(self, consumer: EventSource, item: Delivered) -> list[Decision]:
        """``feed`` one record; one whose folding raises is poison: dead-lettered with the
        reason, the state as before it (``policy.step`` is pure), and decide carries on."""
        try:
            return self.feed(item.event, now_us())
        except Exception as exc:
            await consumer.refuse(item, exc)
            return []

    async def publish(self, decisions: list[Decision], cause_times: dict[str, int]) -> None:
        for d in decisions:
            cmd: Command = signing.sign(self.opts.key, d.job_id, d.subject, d.command)
            event = make_event(cmd, event_id=derived_id("command", cmd.idempotency_key),
                               job_id=d.job_id, event_time=cmd.issued_at, source=SOURCE,
                               subject=d.subject)
            await self._prod().send(event)
            metrics.COMMANDS.labels(cmd.action.value, str(cmd.tier)).inc()
            for vid in cmd.cause_verdict_ids:
                if vid in cause_times:
                    metrics.PHASE.labels("decide").observe(
                        max(0.0, (cmd.issued_at - cause_times[vid]) / 1e6))
            log.warning("decided %s tier %d for %s: %s", cmd.action.value, cmd.tier, d.job_id,
                        cmd.params.reason)

    def _prod(self) -> EventSink:
        assert self.producer is not None, "run() starts the producer"
        return self.producer

    async def run(self, stop: asyncio.Event) -> None:
        self.producer = self.bus.producer()
        await self.producer.start()
        # dedupe: a record written twice (a producer's retry) is folded once
        consumer = self.bus.consumer(ROLES, group_id=None, name="decide", dlq=self.producer,
                                     from_offset="earliest", dedupe=True)
        await consumer.start()
        seen: dict[str, int] = {}
        try:
            backlog: list[Decision] = []
            on_topic: set[str] = set()
            for d in await consumer.drain(idle_ms=500, limit_s=120):
                if isinstance(d.event.payload, Command):
                    on_topic.add(d.event.payload.idempotency_key)
                if self._wanted(d.event):
                    backlog.extend(await self._guarded(consumer, d))
            fresh = [d for d in backlog if d.command.idempotency_key not in on_topic]
            await self.publish(fresh, seen)
            log.warning("decide: caught up (%d open verdicts, %d pending commands)",
                        len(self.state.open), len(self.state.pending))
            while not stop.is_set():
                out: list[Decision] = []
                for d in await consumer.poll(timeout_ms=int(self.opts.tick_s * 1000)):
                    ev = d.event
                    if not self._wanted(ev):
                        continue
                    if isinstance(ev.payload, Verdict):
                        seen[ev.payload.verdict_id] = ev.ingest_time or ev.event_time
                    out.extend(await self._guarded(consumer, d))
                self.state, more = policy.tick(self.state, now_us(), self.opts.policy)
                await self.publish(out + more, seen)
        finally:
            await consumer.stop()
            await self.producer.stop()
