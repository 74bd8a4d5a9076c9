"""`trainguard decide`: the decision service, the only holder of the command signing key.

It reads verdicts, commands, outcomes (with the pool) and checkpoint events, folds them through
the pure policy (``policy.py``), and publishes each decision as a ``command`` signed with its
Ed25519 key. At start it reads every topic from the beginning to rebuild its state; decisions
derived during that catch-up are published only if their idempotency key is not already on
the commands topic, so a restarted service does not repeat itself.

Active and standby (``--group-id``): several instances join one consumer group on the commands
topic (``Bus.lease``); each is active for the jobs whose commands go to a partition it holds,
and a hot standby for the rest. Every instance reads and folds everything, so a standby's state
is current; it publishes nothing for a job it does not hold and keeps what it decided for it
(``standing``) until that command shows up on the commands topic. When it takes a job over (the
active one stopped, or its session timed out after a kill), it first reads the commands topic
to its end, then publishes what it decided that is still pending and not on the topic: no
decision of the old instance is lost, and none is issued twice under another key. A command the
old instance wrote in its last moments and the new one had not read yet is written again under
the same event id and idempotency key: readers deduplicate it and the actuator acts on a key
once. Each partition's commands go through a fenced producer (``Bus.fenced_producer``, id
``<group>-p<partition>``) that the new holder starts before it reads the commands topic to its
end: an old holder that still runs (paused past its session, then woken, its lease not yet
told) is refused by the broker, so it cannot publish a decision made on a stale view.

What it believes (``signing.Trust``): a command only when it verifies with decide's own public
key, an outcome or pool event only when it verifies with a trusted actuator key. Anything else
of those types is dead-lettered by the consumer and never reaches the policy: a forged command
cannot count as issued (squatting the idempotency key derived from a visible verdict id), and a
forged ``pool.unit`` cannot move a rank or an epoch.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from trainguard.actuators import metrics, policy, signing
from trainguard.actuators.policy import Decision, PolicyConfig, PolicyState
from trainguard.bus.consumer import Delivered
from trainguard.bus.errors import Fenced
from trainguard.bus.protocol import Bus, EventSink, EventSource, Lease
from trainguard.events.clock import now_us
from trainguard.events.codec import make_event, type_of_payload
from trainguard.events.envelope import Event
from trainguard.events.ids import derived_id
from trainguard.events.payloads import Command, Verdict
from trainguard.events.registry import BY_NAME
from trainguard.events.topics import TopicRole

log = logging.getLogger(__name__)
SOURCE = "trainguard-decide"
INPUT_TYPES = frozenset(type_of_payload(model).name for model in policy.INPUTS)
ROLES = tuple(role for role in TopicRole if any(BY_NAME[t].topic is role for t in INPUT_TYPES))


@dataclass(frozen=True)
class DeciderOptions:
    key: signing.PrivateKey
    actuators: signing.KeySet = field(default_factory=signing.KeySet)  # trusted actuator keys
    # decide's earlier public keys: its own commands signed before a key rotation still count
    # as issued when it reads the commands topic back
    previous: signing.KeySet = field(default_factory=signing.KeySet)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    tick_s: float = 0.25
    jobs: frozenset[str] | None = None  # None: every job
    group_id: str | None = None  # None: one instance, active for every job


class Decider:
    def __init__(self, bus: Bus, opts: DeciderOptions) -> None:
        self.bus = bus  # Kafka (``KafkaBus``), or the in-memory twin in unit tests
        self.opts = opts
        self.state = PolicyState()
        self.producer: EventSink | None = None  # made inside the running loop
        self.lease: Lease | None = None
        # with a lease: partition -> the fenced producer its commands go through (started when
        # this instance gained the partition; starting it fenced the old holder's)
        self.fences: dict[int, EventSink] = {}
        self.fenced_out: set[int] = set()  # fenced by a newer holder: not taken back while held
        # decided for a job another instance is active for: idempotency key -> decision,
        # until the command is read back from the topic (or this instance takes the job over)
        self.standing: dict[str, Decision] = {}
        self.trust = signing.Trust(
            decide=opts.previous | signing.KeySet.of([opts.key.public()]),
            actuators=opts.actuators)

    def wanted(self, event: Event) -> bool:
        """An input of the policy for a job of ours, and believed: a record of a signed type
        whose signature does not verify never reaches the policy (the consumer has already
        dead-lettered it; checked again here, where the state is)."""
        return (event.type in INPUT_TYPES
                and (self.opts.jobs is None or event.job_id in self.opts.jobs)
                and self.trust.check(event) is None)

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

    def active(self, job_id: str) -> bool:
        """Whether this instance publishes the commands of ``job_id`` (see the module's text):
        it holds their partition and its fenced producer there is started and not fenced."""
        return self.lease is None or self._partition(job_id) in self.fences

    def _partition(self, job_id: str) -> int | None:
        assert self.lease is not None
        p = self.lease.partition(job_id.encode())
        return p if p is not None and p in self.lease.held() else None

    async def _refence(self) -> bool:
        """Fenced producers for the partitions held now, none for the others; True when one
        was started (its old holder can publish nothing more there: read the commands topic
        to its end, then take over). One that fails to start is tried again next tick."""
        assert self.lease is not None
        held = self.lease.held()
        self.fenced_out &= held
        for p in sorted(set(self.fences) - held):
            await self._close_fence(p)
        started = False
        for p in sorted(held - set(self.fences) - self.fenced_out):
            prod = self.bus.fenced_producer(f"{self.opts.group_id}-p{p}")
            try:
                await prod.start()
            except Exception as exc:
                log.error("decide: cannot start the fenced producer of partition %d (tried "
                          "again): %s", p, exc)
                continue
            self.fences[p] = prod
            started = True
        return started

    async def _close_fence(self, p: int) -> None:
        prod = self.fences.pop(p, None)
        if prod is not None:
            try:
                await prod.stop()
            except Exception as exc:  # a fenced producer's client may fail to stop cleanly
                log.debug("decide: stopping the fenced producer of partition %d: %s", p, exc)

    def _read_back(self, event: Event) -> None:
        if isinstance(event.payload, Command):
            self.standing.pop(event.payload.idempotency_key, None)

    def _prune_standing(self) -> None:
        """What the policy no longer waits for (its outcome came, its cause ended) is no
        longer standing."""
        for key in [k for k in self.standing if k not in self.state.pending]:
            del self.standing[key]

    def _take_over(self) -> list[Decision]:
        """What this instance decided for jobs it is now active for, still pending and not
        on the commands topic (call with the commands topic read to its end)."""
        self._prune_standing()
        out = [d for d in self.standing.values() if self.active(d.job_id)]
        for d in out:
            del self.standing[d.command.idempotency_key]
        return out

    async def publish(self, decisions: list[Decision], cause_times: dict[str, int]) -> None:
        for d in decisions:
            if not self.active(d.job_id):
                self.standing[d.command.idempotency_key] = d
                continue
            cmd: Command = signing.sign(self.opts.key, d.job_id, d.subject, d.command)
            event = make_event(cmd, event_id=derived_id("command", cmd.idempotency_key),
                               job_id=d.job_id, event_time=cmd.issued_at, source=SOURCE,
                               subject=d.subject)
            p = None if self.lease is None else self._partition(d.job_id)
            try:
                await (self._prod() if p is None else self.fences[p]).send(event)
            except Fenced as exc:  # another instance holds the partition now
                assert p is not None
                log.error("decide: %s: partition %d is another instance's, %s waits as a "
                          "standby's decision", exc, p, cmd.idempotency_key)
                self.fenced_out.add(p)
                await self._close_fence(p)
                self.standing[d.command.idempotency_key] = d
                continue
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
        if self.opts.group_id is not None:
            self.lease = self.bus.lease(TopicRole.COMMANDS, group_id=self.opts.group_id,
                                        name="decide")
            await self.lease.start()
        # dedupe: a record written twice (a producer's retry) is folded once; a record of a
        # signed type that does not verify is dead-lettered, never folded
        consumer = self.bus.consumer(ROLES, group_id=None, name="decide", dlq=self.producer,
                                     from_offset="earliest", dedupe=True,
                                     check=self.trust.check)
        await consumer.start()
        seen: dict[str, int] = {}
        try:
            backlog: list[Decision] = []
            on_topic: set[str] = set()
            for d in await consumer.drain(idle_ms=500, limit_s=120):
                if isinstance(d.event.payload, Command):
                    on_topic.add(d.event.payload.idempotency_key)
                if self.wanted(d.event):
                    backlog.extend(await self._guarded(consumer, d))
            fresh = [d for d in backlog if d.command.idempotency_key not in on_topic]
            await self.publish(fresh, seen)
            log.warning("decide: caught up (%d open verdicts, %d pending commands)",
                        len(self.state.open), len(self.state.pending))
            while not stop.is_set():
                out = await self._fold(consumer, await consumer.poll(
                    timeout_ms=int(self.opts.tick_s * 1000)), seen)
                if self.lease is not None and await self._refence():
                    # what the old holder committed before it was fenced, then take over
                    out += await self._fold(consumer, await consumer.drain(
                        idle_ms=200, limit_s=30), seen)
                    out += self._take_over()
                self.state, more = policy.tick(self.state, now_us(), self.opts.policy)
                await self.publish(out + more, seen)
                self._prune_standing()
        finally:
            await consumer.stop()
            for p in sorted(self.fences):
                await self._close_fence(p)
            if self.lease is not None:
                await self.lease.stop()
            await self.producer.stop()

    async def _fold(self, consumer: EventSource, items: list[Delivered],
                    seen: dict[str, int]) -> list[Decision]:
        out: list[Decision] = []
        for d in items:
            ev = d.event
            if not self.wanted(ev):
                continue
            self._read_back(ev)
            if isinstance(ev.payload, Verdict):
                seen[ev.payload.verdict_id] = ev.ingest_time or ev.event_time
            out.extend(await self._guarded(consumer, d))
        return out
