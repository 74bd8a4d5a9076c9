"""The node agent's loop: every interval, run the collectors and publish one telemetry record
for the node, plus each discrete event (step reports, exits, kernel signals) on its own.

Everything goes through the spool (``spool.py``); the publisher (``publisher.py``) drains it.
Sources that can wake the agent between intervals (the step socket, pidfds) are drained as
soon as they are readable, so a step report or a process exit does not wait for the tick.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainguard.agent.metrics import AgentMetrics
from trainguard.agent.publisher import SpoolPublisher
from trainguard.agent.spool import DiskSpool
from trainguard.collectors.base import Collector, Discrete, Reading
from trainguard.events.clock import now_us
from trainguard.events.codec import encode, make_event, partition_key
from trainguard.events.envelope import Event, Subject
from trainguard.events.errors import ContractError
from trainguard.events.ids import new_event_id
from trainguard.events.payloads import NodeTelemetry
from trainguard.events.registry import BY_NAME
from trainguard.events.topics import TopicNames

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.1


@dataclass(frozen=True)
class AgentIdentity:
    node: str
    job_id: str | None = None  # node-level events are filed under "node:<node>" by default

    @property
    def source(self) -> str:
        return f"agent@{self.node}"

    @property
    def node_job(self) -> str:
        return self.job_id or f"node:{self.node}"


class NodeAgent:
    def __init__(
        self,
        identity: AgentIdentity,
        collectors: Sequence[Collector],
        spool: DiskSpool,
        publisher: SpoolPublisher,
        names: TopicNames,
        metrics: AgentMetrics,
        *,
        interval_s: float = 1.0,
        job_of_node: Callable[[], str | None] | None = None,
    ) -> None:
        if interval_s < MIN_INTERVAL_S:
            raise ValueError(f"interval_s: must be >= {MIN_INTERVAL_S} (got {interval_s})")
        self.identity = identity
        self.collectors = list(collectors)
        self.spool = spool
        self.publisher = publisher
        self.names = names
        self.metrics = metrics
        self.interval_s = interval_s
        self.job_of_node = job_of_node
        self.seq = 0
        self._malformed_seen: set[str] = set()
        self._dropped_reported: dict[str, int] = {}

    # -- one interval -------------------------------------------------------------------

    def tick(self, at_us: int | None = None) -> Reading:
        """Run every collector once and spool what they saw. Returns the merged reading."""
        at = now_us() if at_us is None else at_us
        started = time.perf_counter()
        reading = Reading()
        for collector in self.collectors:
            try:
                reading.merge(collector.collect(at))
            except Exception:  # a collector bug must not stop the node's other signals
                log.exception("collector %s failed", getattr(collector, "name", collector))
                reading.malformed[f"collector_error:{getattr(collector, 'name', '?')}"] = 1
        self.metrics.collect_seconds.observe(time.perf_counter() - started)
        self.publish_discrete(reading.discrete)
        self._count_malformed(reading.malformed)
        telemetry = NodeTelemetry(
            interval_ms=self.interval_s * 1000, seq=self.seq, gpus=reading.gpus,
            nics=reading.nics, paths=reading.paths, processes=reading.processes,
            tcp_retransmits=reading.tcp_retransmits)
        self.seq += 1
        job = (self.job_of_node() if self.job_of_node else None) or self.identity.node_job
        self._spool(make_event(telemetry, event_id=new_event_id(), job_id=job, event_time=at,
                               source=self.identity.source,
                               subject=Subject(node=self.identity.node)))
        return reading

    def publish_discrete(self, items: Sequence[Discrete]) -> None:
        for item in items:
            subject = item.subject
            if subject.node is None:
                subject = subject.model_copy(update={"node": self.identity.node})
            try:
                event = make_event(item.payload, event_id=new_event_id(), job_id=item.job_id,
                                   event_time=item.event_time, source=self.identity.source,
                                   subject=subject)
            except ContractError as err:
                self._count_malformed({f"invalid_{type(item.payload).__name__}": 1})
                log.warning("refused a %s from a collector: %s", type(item.payload).__name__, err)
                continue
            self._spool(event)

    def _spool(self, event: Event) -> None:
        stamped = event.model_copy(update={"ingest_time": now_us()})
        key, value = partition_key(event), encode(stamped)
        for role in BY_NAME[event.type].topics:  # an urgent type: the copy too, same bytes
            rec = self.spool.put(self.names.name(role), key, value, event.type,
                                 event.event_time // 1000)
            self.publisher.note_put(rec)
        for event_type, n in self.spool.dropped.items():
            already = self._dropped_reported.get(event_type, 0)
            if n > already:
                self.metrics.dropped.labels(event_type, "spool_full").inc(n - already)
                self._dropped_reported[event_type] = n

    def _count_malformed(self, malformed: dict[str, int]) -> None:
        for kind, n in malformed.items():
            self.metrics.malformed.labels(kind).inc(n)
            if kind not in self._malformed_seen:
                self._malformed_seen.add(kind)
                log.warning("malformed input from a source: %s (logged once per kind)", kind)

    # -- the loop -----------------------------------------------------------------------

    async def run(
        self,
        stop: asyncio.Event,
        readers: Sequence[tuple[int, Callable[[], Sequence[Discrete]]]] = (),
        fast_polls: Sequence[Callable[[int], Sequence[Discrete]]] = (),
        fast_poll_s: float = 0.05,
    ) -> None:
        """Tick every interval until ``stop``. Between ticks, drain each (fd, drain) reader
        as soon as it is readable, and run each fast poll (e.g. pidfd exits) every
        ``fast_poll_s``, so urgent events do not wait for the next interval."""
        loop = asyncio.get_running_loop()
        for fd, drain in readers:
            loop.add_reader(fd, self._drain_reader, drain)
        publisher = asyncio.create_task(self.publisher.run(stop))
        fast = asyncio.create_task(self._fast_polls(stop, fast_polls, fast_poll_s))
        try:
            next_at = loop.time()
            while not stop.is_set():
                self.tick()
                next_at += self.interval_s
                delay = next_at - loop.time()
                if delay < 0:  # overran: skip the lost intervals instead of bursting
                    next_at = loop.time()
                    delay = 0
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass
        finally:
            for fd, _ in readers:
                loop.remove_reader(fd)
            await fast
            await publisher

    async def _fast_polls(self, stop: asyncio.Event,
                          polls: Sequence[Callable[[int], Sequence[Discrete]]],
                          every_s: float) -> None:
        while polls and not stop.is_set():
            for poll in polls:
                self._drain_reader(lambda poll=poll: poll(now_us()))  # type: ignore[misc]
            try:
                await asyncio.wait_for(stop.wait(), every_s)
            except TimeoutError:
                pass

    def _drain_reader(self, drain: Callable[[], Sequence[Discrete]]) -> None:
        try:
            self.publish_discrete(drain())
        except Exception:
            log.exception("draining a reader failed")
