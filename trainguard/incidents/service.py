"""`trainguard incident serve`: the log's topics in, incident transitions out.

Start: the incidents topic is read to learn which transitions are already published, the
input topics are read from the beginning to their end and folded in event-time order to
rebuild every incident (the state is the log; nothing else is kept), and the missing
transitions are published. Then a consumer group
follows the topics; each batch's transitions are published (acks=all) before its offsets are
committed. A restart publishes nothing twice: transition ids are derived from the incident and
its sequence number, and ids already on the topic are skipped (consumers dedupe by id anyway).
When the log is quiet for ``idle_flush_s`` the reorder buffer is flushed so the tail of a
finished job is decided too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from trainguard.bus.consumer import Check
from trainguard.bus.protocol import Bus
from trainguard.events.envelope import Event
from trainguard.events.topics import TopicRole
from trainguard.incidents.live import LiveIncidents
from trainguard.incidents.query import canonical
from trainguard.incidents.settings import IncidentSettings
from trainguard.incidents.source import order

log = logging.getLogger(__name__)
INPUT_ROLES = (TopicRole.TASK, TopicRole.VERDICTS, TopicRole.COMMANDS, TopicRole.OUTCOMES)


@dataclass
class ServiceStats:
    consumed: int = 0
    published: int = 0
    already_published: int = 0
    # an id already on the topic with other content: a record came later than the lateness
    # bound before (the published one stays; `trainguard replay` lists the difference)
    conflicts: int = 0
    batches: int = 0


class Sender(Protocol):
    async def enqueue(self, event: Event) -> Any:
        """Hand the event to the producer; the returned future resolves on the broker's ack."""
        ...


class Publisher:
    """Publishes transitions once: ids seen on the incidents topic or sent here are skipped."""

    def __init__(self, producer: Sender, known: dict[str, bytes],
                 stats: ServiceStats) -> None:
        self.producer = producer
        self.known = known  # event id -> canonical bytes
        self.stats = stats

    async def publish(self, transitions: list[Event]) -> None:
        futures = []
        for t in transitions:
            mine = canonical(t)
            theirs = self.known.get(t.event_id)
            if theirs is not None:
                self.stats.already_published += 1
                if theirs != mine:
                    self.stats.conflicts += 1
                    log.warning("incidents: transition %s differs from the one published "
                                "(a record arrived later than the lateness bound); the "
                                "published one stays", t.event_id)
                continue
            futures.append(await self.producer.enqueue(t))
            self.known[t.event_id] = mine
        for fut in futures:
            await fut  # acknowledged (acks=all) before the caller commits its offsets
        self.stats.published += len(futures)


async def serve(bus: Bus, *, settings: IncidentSettings | None = None,
                group: str | None = None, idle_flush_s: float = 5.0,
                stop: asyncio.Event | None = None, stats: ServiceStats | None = None,
                check: Check | None = None, live: LiveIncidents | None = None,
                observe: Callable[[Event], None] | None = None) -> ServiceStats:
    """``check`` (``signing.Trust.check``): commands, outcomes and pool events are folded only
    when their signature verifies; the others are dead-lettered by the consumer and left out
    of the history read at start. None: nothing is checked (in-process tests).

    ``live``: the fold to use (the served pages read it); ``observe``: called with every
    accepted input event, history and live, before it is folded (the pages' event context)."""
    stats = stats or ServiceStats()
    stop = stop or asyncio.Event()
    live = live if live is not None else LiveIncidents(settings)
    seen = observe or (lambda _ev: None)
    known = {e.event_id: canonical(e) for e in await bus.read([TopicRole.INCIDENTS])
             if e.type == "incident.transition"}
    producer = bus.producer()
    await producer.start()
    consumer = bus.consumer(INPUT_ROLES, group_id=group or f"{bus.names.prefix}-incidents",
                            name="incidents", dlq=producer, from_offset="earliest", check=check)
    try:
        publisher = Publisher(producer, known, stats)
        history = await bus.read(INPUT_ROLES)
        if check is not None:
            history = [e for e in history if check(e) is None]
        out: list[Event] = []
        # topic by topic is not an arrival order within any lateness: time order is
        for ev in order(history):
            seen(ev)
            try:
                out += live.feed(ev)
            except Exception as exc:  # the live consumer below dead-letters it
                log.error("incidents: folding %s %s raised %s: %s; left out", ev.type,
                          ev.event_id, type(exc).__name__, exc)
                log.debug("incidents: the traceback", exc_info=exc)
        out += live.catch_up()
        stats.consumed += len(history)
        await publisher.publish(out)
        log.info("incidents: rebuilt from %d events, %d transitions known",
                 len(history), len(known))
        await consumer.start()
        loop = asyncio.get_running_loop()
        last_input = loop.time()
        while not stop.is_set():
            batch = await consumer.poll(timeout_ms=500)
            out = []
            by_id = {item.event.event_id: item for item in batch}
            for ev in order(item.event for item in batch):  # a batch spans partitions
                seen(ev)
                try:
                    out += live.feed(ev)
                except Exception as exc:  # poison for the fold: dead-lettered, carry on
                    await consumer.refuse(by_id[ev.event_id], exc)
            out += live.catch_up()  # records that came behind the watermark, in their place
            if batch:
                last_input = loop.time()
            elif live.buffered and loop.time() - last_input >= idle_flush_s:
                out += live.flush()
            await publisher.publish(out)
            if consumer.uncommitted:  # refused records too: a restart does not read them
                await consumer.commit()
            if batch:
                stats.consumed += len(batch)
                stats.batches += 1
    finally:
        await consumer.stop()
        await producer.stop()
    return stats
