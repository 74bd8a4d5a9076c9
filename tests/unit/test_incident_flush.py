"""The live incident service flushes its reorder buffer on a quiet log only once it has read
everything on the broker. A 2026-12-06 CI run of ``test_incident_service_outage`` saw it
publish "located -> recovered without action" for an exit whose migrate command was still
unread on another topic: after the broker came back, a poll returned nothing for longer than the
idle flush while the commands partition was behind, the flush folded the verdict's resolve
first, and the rebuild's "located -> mitigating (tier 2: migrate)" then conflicted with it.
Here the in-memory consumer holds one topic back (``caught_up`` stays False meanwhile)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from trainguard.bus.consumer import Check
from trainguard.bus.memory import MemoryBus, MemoryConsumer, Record
from trainguard.bus.protocol import EventSink
from trainguard.events.envelope import Event
from trainguard.events.topics import TopicRole
from trainguard.incidents import IncidentSettings, rebuild
from trainguard.incidents.query import canonical
from trainguard.incidents.service import ServiceStats, serve
from trainguard.incidents.synth import incident_log

pytestmark = pytest.mark.unit
SETTINGS = IncidentSettings()


class LaggingConsumer(MemoryConsumer):
    """Fetches nothing of ``lagging`` (a topic) while it is set, as a consumer whose fetch of
    one partition is behind: the records are on the bus, ``caught_up()`` is False."""

    lagging: str | None = None

    def _take(self, max_records: int | None) -> list[tuple[str, int, int, Record]]:
        if self.lagging is None:
            return super()._take(max_records)
        pos = self._pos()
        held = {k: v for k, v in pos.items() if k[0] == self.lagging}
        for k in held:
            del pos[k]
        try:
            return super()._take(max_records)
        finally:
            pos.update(held)


class LaggingBus(MemoryBus):
    def __init__(self) -> None:
        super().__init__()
        self.followers: list[LaggingConsumer] = []

    def consumer(self, roles: Sequence[TopicRole], *, group_id: str | None, name: str,
                 dlq: EventSink | None, from_offset: str = "earliest",
                 dedupe: bool = False, check: Check | None = None,
                 start_at: object = None) -> MemoryConsumer:
        c = LaggingConsumer(self, roles, group_id=group_id, name=name, dlq=dlq,
                            from_offset=from_offset, dedupe=dedupe, check=check)
        self.followers.append(c)
        return c


async def serving_after(bus: MemoryBus, first: list[Event]
                        ) -> tuple[ServiceStats, asyncio.Event, asyncio.Task[ServiceStats]]:
    """``first`` published, then the service started (idle flush 0.2 s, polls of 50 ms)."""
    await bus.publish(first)
    stats = ServiceStats()
    stop = asyncio.Event()
    task = asyncio.create_task(serve(bus, settings=SETTINGS, idle_flush_s=0.2, stop=stop,
                                     stats=stats, poll_ms=50))
    return stats, stop, task


def published(bus: MemoryBus) -> list[bytes]:
    return sorted(canonical(e) for e in bus.events(TopicRole.INCIDENTS)
                  if e.type == "incident.transition")


async def published_at_the_end(bus: MemoryBus, n: int, stop: asyncio.Event,
                               task: asyncio.Task[ServiceStats]) -> list[bytes]:
    """The transitions on the topic once ``n`` are there (or 20 s passed) and half a second
    more has brought nothing else; the service stopped."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while len(published(bus)) < n and loop.time() < deadline:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # nothing more, nothing different
    stop.set()
    await task
    return published(bus)


def test_a_quiet_poll_with_a_topic_still_unread_does_not_flush() -> None:
    log = incident_log()
    expected = sorted(canonical(t) for t in rebuild(log, SETTINGS))
    bus = LaggingBus()
    half = len(log) // 2

    async def go() -> tuple[list[bytes], ServiceStats]:
        stats, stop, task = await serving_after(bus, log[:half])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while stats.consumed < half and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for c in bus.followers:
            c.lagging = bus.names.name(TopicRole.COMMANDS)
        await bus.publish(log[half:])
        await asyncio.sleep(1.5)  # quiet for far longer than the idle flush
        for c in bus.followers:
            c.lagging = None
        return await published_at_the_end(bus, len(expected), stop, task), stats

    got, stats = asyncio.run(asyncio.wait_for(go(), 60))
    assert stats.conflicts == 0
    assert got == expected


def test_a_reader_that_cannot_tell_still_flushes_after_the_longer_bound() -> None:
    """caught_up() failing (the broker away) never keeps the tail undecided for good."""
    log = incident_log()
    expected = sorted(canonical(t) for t in rebuild(log, SETTINGS))
    bus = LaggingBus()

    async def go() -> list[bytes]:
        await bus.publish(log)
        stop = asyncio.Event()
        stats = ServiceStats()

        async def broken() -> bool:
            raise ConnectionError("the broker is away")

        task = asyncio.create_task(serve(bus, settings=SETTINGS, idle_flush_s=0.1,
                                         unread_flush_s=0.8, stop=stop, stats=stats,
                                         poll_ms=50))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 20
        while not bus.followers and loop.time() < deadline:
            await asyncio.sleep(0.01)
        for c in bus.followers:
            c.caught_up = broken  # type: ignore[method-assign]
        return await published_at_the_end(bus, len(expected), stop, task)

    assert asyncio.run(asyncio.wait_for(go(), 60)) == expected


def test_late_records_are_folded_only_once_every_topic_is_read() -> None:
    """After a flush (the step reports of an outage's spool), the verdicts and commands come
    behind the watermark. A poll that brings the verdicts' resolve while the commands topic is
    still unread must not fold them: "located -> recovered without action" would go out and
    conflict with the rebuild's migrate (the second failure of the outage test in CI)."""
    log = incident_log()
    expected = sorted(canonical(t) for t in rebuild(log, SETTINGS))
    bus = LaggingBus()
    half = len(log) // 2
    rest = log[half:]

    async def go() -> tuple[list[bytes], ServiceStats]:
        stats, stop, task = await serving_after(bus, log[:half])
        loop = asyncio.get_running_loop()

        async def wait_consumed(n: int) -> None:
            deadline = loop.time() + 20
            while stats.consumed < n and loop.time() < deadline:
                await asyncio.sleep(0.02)

        await wait_consumed(half)
        steps = [e for e in rest if e.type == "step.report"]
        await bus.publish(steps)
        await wait_consumed(half + len(steps))
        await asyncio.sleep(1.0)  # quiet and read: the buffer is flushed
        for c in bus.followers:
            c.lagging = bus.names.name(TopicRole.COMMANDS)
        await bus.publish([e for e in rest if e.type != "step.report"])
        await asyncio.sleep(1.5)  # far longer than the idle flush, the commands unread
        for c in bus.followers:
            c.lagging = None
        return await published_at_the_end(bus, len(expected), stop, task), stats

    got, stats = asyncio.run(asyncio.wait_for(go(), 60))
    assert stats.conflicts == 0
    assert got == expected
