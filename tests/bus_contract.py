"""One contract suite for every bus (as pyeventsourcing's tests/persistence.py runs one suite
against every recorder): ``tests/unit/test_bus_memory.py`` runs it on the in-memory bus,
``tests/integration/test_bus_kafka.py`` on the real broker. A subclass provides the ``bus``
fixture and ``dead_letters``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from trainguard.bus.consumer import Delivered
from trainguard.bus.dlq import DeadLetter
from trainguard.bus.errors import Fenced
from trainguard.bus.protocol import Bus, EventSource, RawRecord, RecordSource
from trainguard.events.codec import decode, make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import Command, CommandAction, Heartbeat
from trainguard.events.topics import SPEC_BY_ROLE, TopicRole
from trainguard.rules.synth import process_exit

T = TypeVar("T")
LIMIT_S = 45.0


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, LIMIT_S))


def beat(job: str, n: int, ingest_time: int | None = None) -> Event:
    return make_event(Heartbeat(rank=0, step=n), event_id=f"hb-{job}-{n:04d}", job_id=job,
                      event_time=1_000_000 + n, source="contract", subject=Subject(rank=0),
                      ingest_time=ingest_time)


def command_for(job: str) -> Event:
    """A command event of ``job`` (unsigned: the readers here check nothing)."""
    cmd = Command(command_id=f"c-{job}", idempotency_key=f"c-{job}",
                  action=CommandAction.RAISE_QUOTA, tier=1, issued_at=1_000_000,
                  issued_by="contract", params={"rank": 0})
    return make_event(cmd, event_id=f"command-{job}", job_id=job, event_time=1_000_000,
                      source="contract", subject=Subject(rank=0))


def steps(events: list[Event]) -> list[int | None]:
    return [e.payload.step if isinstance(e.payload, Heartbeat) else None for e in events]


async def delivered_until(consumer: EventSource, n: int,
                          limit_s: float = 30.0) -> list[Delivered]:
    """Poll until ``n`` events came (or the limit: then what came, for the assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    out: list[Delivered] = []
    while len(out) < n and loop.time() < deadline:
        out += await consumer.poll(timeout_ms=200)
    return out


async def poll_until(consumer: EventSource, n: int, limit_s: float = 30.0) -> list[Event]:
    return [d.event for d in await delivered_until(consumer, n, limit_s)]


class BusContract:
    """The semantics of ``trainguard/bus/protocol.py``."""

    def dead_letters(self, bus: Bus) -> list[DeadLetter]:
        raise NotImplementedError

    def test_a_jobs_events_keep_their_order_on_one_partition(self, bus: Bus) -> None:
        async def go() -> None:
            prod = bus.producer()
            await prod.start()
            sent = [beat(job, n) for n in range(6) for job in ("job-a", "job-b")]
            for ev in sent:
                await prod.send(ev)
            consumer = bus.consumer([TopicRole.TASK], group_id=None, name="t", dlq=prod)
            await consumer.start()
            try:
                got = await delivered_until(consumer, len(sent))
            finally:
                await consumer.stop()
                await prod.stop()
            for job in ("job-a", "job-b"):
                mine = [d for d in got if d.event.job_id == job]
                assert [d.event.event_id for d in mine] == [
                    e.event_id for e in sent if e.job_id == job]
                assert len({d.partition for d in mine}) == 1
                offsets = [d.offset for d in mine]
                assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        run(go())

    def test_ingest_time_is_stamped_once_and_kept(self, bus: Bus) -> None:
        async def go() -> list[Event]:
            prod = bus.producer()
            await prod.start()
            try:
                await prod.send(beat("job-a", 1))
                await prod.send(beat("job-a", 2, ingest_time=7))
            finally:
                await prod.stop()
            return await bus.read([TopicRole.TASK])
        first, second = sorted(run(go()), key=lambda e: e.event_id)
        assert first.ingest_time is not None and first.ingest_time > 7
        assert second.ingest_time == 7

    def test_an_urgent_event_also_goes_to_the_urgent_topic_and_nothing_else_does(
            self, bus: Bus) -> None:
        exit_ = process_exit("job-a", "n1", 0, 1_000_005, signal=9)

        async def go() -> tuple[list[Event], list[Event]]:
            prod = bus.producer()
            await prod.start()
            try:
                await prod.send(beat("job-a", 1))
                await prod.send(exit_)
                await prod.send(beat("job-a", 9))
            finally:
                await prod.stop()
            return await bus.read([TopicRole.TASK]), await bus.read([TopicRole.URGENT])
        own, copies = run(go())
        assert [e.event_id for e in own] == [beat("job-a", 1).event_id, exit_.event_id,
                                             beat("job-a", 9).event_id]
        assert copies == [own[1]]  # the same event, ingest time included

    def test_a_group_goes_on_from_its_commit_and_only_from_its_commit(self, bus: Bus) -> None:
        async def go() -> tuple[list[Event], list[Event], list[Event]]:
            prod = bus.producer()
            await prod.start()
            try:
                for n in range(3):
                    await prod.send(beat("job-a", n))
                a = bus.consumer([TopicRole.TASK], group_id="g1", name="a", dlq=prod)
                await a.start()
                first = await poll_until(a, 3)
                await a.commit()
                await a.stop()
                for n in range(3, 5):
                    await prod.send(beat("job-a", n))
                b = bus.consumer([TopicRole.TASK], group_id="g1", name="b", dlq=prod)
                await b.start()
                second = await poll_until(b, 2)  # not committed: a restart sees them again
                await b.stop()
                c = bus.consumer([TopicRole.TASK], group_id="g1", name="c", dlq=prod)
                await c.start()
                third = await poll_until(c, 2)
                await c.commit()
                await c.stop()
                return first, second, third
            finally:
                await prod.stop()
        first, second, third = run(go())
        assert steps(first) == [0, 1, 2]
        assert steps(second) == [3, 4]
        assert steps(third) == [3, 4]

    def test_start_at_overrides_the_commit_and_positions_say_where_reading_goes_on(
            self, bus: Bus) -> None:
        async def go() -> tuple[dict[tuple[str, int], int], list[Event], list[Event],
                                dict[tuple[str, int], int]]:
            prod = bus.producer()
            await prod.start()
            try:
                for n in range(5):
                    await prod.send(beat("job-a", n))
                a = bus.consumer([TopicRole.TASK], group_id="g-at", name="a", dlq=prod)
                await a.start()
                await poll_until(a, 5)
                await a.commit()
                at = await a.positions()
                await a.stop()
                (tp, end), = ((k, v) for k, v in at.items() if v)  # one job: one partition
                # a snapshot covering the first two records: the group committed all five
                b = bus.consumer([TopicRole.TASK], group_id="g-at", name="b", dlq=prod,
                                 start_at={tp: end - 3})
                await b.start()
                again = await poll_until(b, 3)
                await b.commit()
                after = await b.positions()
                await b.stop()
                c = bus.consumer([TopicRole.TASK], group_id=None, name="c", dlq=None,
                                 start_at={tp: end - 1})
                await c.start()
                tail = await poll_until(c, 1)
                await c.stop()
                return at, again, tail, after
            finally:
                await prod.stop()
        at, again, tail, after = run(go())
        assert steps(again) == [2, 3, 4]
        assert steps(tail) == [4]
        assert after == at  # back at the end: what commit() recorded

    def test_without_a_group_reading_starts_at_earliest_or_latest(self, bus: Bus) -> None:
        async def go() -> tuple[list[Event], list[Event]]:
            prod = bus.producer()
            await prod.start()
            try:
                await prod.send(beat("job-a", 0))
                early = bus.consumer([TopicRole.TASK], group_id=None, name="e", dlq=prod,
                                     from_offset="earliest")
                late = bus.consumer([TopicRole.TASK], group_id=None, name="l", dlq=prod,
                                    from_offset="latest")
                await early.start()
                await late.start()
                got_late = await poll_until(late, 1, limit_s=1.5)  # nothing new yet
                await prod.send(beat("job-a", 1))
                got_late += await poll_until(late, 1)
                got_early = await poll_until(early, 2)
                await early.stop()
                await late.stop()
                return got_early, got_late
            finally:
                await prod.stop()
        got_early, got_late = run(go())
        assert steps(got_early) == [0, 1]
        assert steps(got_late) == [1]

    def test_a_bad_record_is_dead_lettered_and_reading_goes_on(self, bus: Bus) -> None:
        async def go() -> tuple[list[Event], int]:
            prod = bus.producer()
            await prod.start()
            try:
                await prod.send(beat("job-a", 0))
                await prod.send_raw(bus.names.name(TopicRole.TASK), b"not an event",
                                    key=b"job-a")
                await prod.send(beat("job-a", 1))
                consumer = bus.consumer([TopicRole.TASK], group_id=None, name="reader",
                                        dlq=prod)
                await consumer.start()
                got = await poll_until(consumer, 2)
                await consumer.stop()
                return got, consumer.stats.dead_lettered
            finally:
                await prod.stop()
        got, dead = run(go())
        assert steps(got) == [0, 1]
        assert dead == 1
        (letter,) = self.dead_letters(bus)
        assert letter.original_value() == b"not an event"
        assert letter.consumer == "reader" and letter.source_offset == 1
        assert letter.source_topic == bus.names.name(TopicRole.TASK)
        assert letter.key_b64 is not None and letter.reason

    def test_read_and_drain_give_everything_now_on_the_topics(self, bus: Bus) -> None:
        async def go() -> tuple[list[Event], list[Event]]:
            prod = bus.producer()
            await prod.start()
            try:
                for n in range(4):
                    await prod.send(beat(f"job-{n % 2}", n))
                await prod.send_raw(bus.names.name(TopicRole.TASK), b"{}", key=b"job-0")
                everything = await bus.read([TopicRole.TASK, TopicRole.VERDICTS])
                consumer = bus.consumer([TopicRole.TASK], group_id=None, name="d", dlq=prod)
                await consumer.start()
                drained = [d.event for d in await consumer.drain(idle_ms=500, limit_s=30)]
                await consumer.stop()
                return everything, drained
            finally:
                await prod.stop()
        everything, drained = run(go())
        assert sorted(e.event_id for e in everything) == sorted(
            beat(f"job-{n % 2}", n).event_id for n in range(4))
        assert sorted(e.event_id for e in drained) == sorted(e.event_id for e in everything)

    def test_caught_up_says_whether_the_reader_is_at_the_end(self, bus: Bus) -> None:
        async def go() -> tuple[bool, bool, bool]:
            prod = bus.producer()
            await prod.start()
            try:
                for n in range(3):
                    await prod.send(beat("job-a", n))
                consumer = bus.consumer([TopicRole.TASK], group_id=None, name="c", dlq=prod)
                await consumer.start()
                try:
                    await consumer.drain(idle_ms=500, limit_s=30)
                    after_drain = await consumer.caught_up()
                    await prod.send(beat("job-a", 3))
                    behind = await consumer.caught_up()
                    await poll_until(consumer, 1)
                    again = await consumer.caught_up()
                finally:
                    await consumer.stop()
                return after_drain, behind, again
            finally:
                await prod.stop()
        assert run(go()) == (True, False, True)

    def test_a_raw_source_gives_records_as_they_are_with_group_positions_and_lag(
            self, bus: Bus) -> None:
        topic = bus.names.name(TopicRole.TASK)

        async def read_until(source: RecordSource, n: int, limit_s: float = 30.0
                             ) -> list[RawRecord]:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + limit_s
            out: list[RawRecord] = []
            while len(out) < n and loop.time() < deadline:
                out += await source.poll(timeout_ms=200)
            return out

        async def go() -> tuple[list[RawRecord], dict[str, int], list[RawRecord],
                                dict[str, int]]:
            prod = bus.producer()
            await prod.start()
            try:
                await prod.send(beat("job-a", 0))
                await prod.send_raw(topic, b"not an event", key=b"job-a")
                a = bus.raw_source([TopicRole.TASK], group_id="raw", name="a")
                await a.start()
                try:
                    first = await read_until(a, 2)
                    lag = await a.lag()
                    await a.commit()
                finally:
                    await a.stop()
                await prod.send(beat("job-a", 1))
                b = bus.raw_source([TopicRole.TASK], group_id="raw", name="b")
                await b.start()
                try:
                    second = await read_until(b, 1)
                    await asyncio.sleep(0.3)
                    second += await b.poll(timeout_ms=300)  # nothing more
                    lag_b = await b.lag()
                finally:
                    await b.stop()
                return first, lag, second, lag_b
            finally:
                await prod.stop()
        first, lag, second, lag_b = run(go())
        assert [r.value for r in first][1] == b"not an event"  # bytes as they are
        assert first[0].value is not None and decode(first[0].value).event_id == "hb-job-a-0000"
        assert {r.topic for r in first} == {topic} and first[1].key == b"job-a"
        assert len({r.partition for r in first}) == 1 and first[0].offset < first[1].offset
        assert sum(lag.values()) == 0 and sum(lag_b.values()) == 0
        assert len(second) == 1 and second[0].value is not None  # from the group's commit on
        assert decode(second[0].value).event_id == "hb-job-a-0001"
        assert self.dead_letters(bus) == []  # a raw reader dead-letters nothing

    def test_a_lease_gives_each_partition_to_one_member_and_hands_over_on_stop(
            self, bus: Bus) -> None:
        group = f"{bus.names.prefix}-lease"
        every = frozenset(range(SPEC_BY_ROLE[TopicRole.COMMANDS].partitions))

        async def until(ok: Callable[[], bool], limit_s: float = 30.0) -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + limit_s
            while not ok() and loop.time() < deadline:
                await asyncio.sleep(0.1)

        async def go() -> tuple[list[frozenset[int]], dict[str, tuple[int, bool, bool]],
                                frozenset[int]]:
            prod = bus.producer()
            await prod.start()
            a = bus.lease(TopicRole.COMMANDS, group_id=group, name="a")
            b = bus.lease(TopicRole.COMMANDS, group_id=group, name="b")
            try:
                await a.start()
                await until(lambda: a.held() == every)
                alone = a.held()
                await b.start()
                await until(lambda: bool(a.held()) and bool(b.held())
                            and a.held() | b.held() == every)
                split = [a.held(), b.held()]
                # where the producer puts a job's records, and who holds that partition
                where: dict[str, tuple[int, bool, bool]] = {}
                jobs = [f"job-{i}" for i in range(12)]
                for job in jobs:
                    await prod.send(command_for(job))
                reader = bus.consumer([TopicRole.COMMANDS], group_id=None, name="r", dlq=None)
                await reader.start()
                try:
                    got = await delivered_until(reader, len(jobs))
                finally:
                    await reader.stop()
                for d in got:
                    key = d.event.job_id.encode()
                    assert a.partition(key) == b.partition(key) == d.partition
                    where[d.event.job_id] = (d.partition, a.holds(key), b.holds(key))
                await b.stop()
                await until(lambda: a.held() == every)
                return [alone, *split], where, a.held()
            finally:
                await a.stop()
                await b.stop()
                await prod.stop()

        (alone, held_a, held_b), where, after = run(go())
        assert alone == every
        assert held_a and held_b and not held_a & held_b and held_a | held_b == every
        assert len(where) == 12
        for partition, in_a, in_b in where.values():  # exactly one member holds each job
            assert in_a == (partition in held_a) and in_b == (partition in held_b)
            assert in_a != in_b
        assert after == every  # a member that stops hands its partitions over

    def test_a_fenced_producer_publishes_nothing_once_a_newer_one_has_its_id(
            self, bus: Bus) -> None:
        fence = f"{bus.names.prefix}-decide-p0"

        async def go() -> tuple[list[str], list[str]]:
            old = bus.fenced_producer(fence)
            new = bus.fenced_producer(fence)
            refused: list[str] = []
            try:
                await old.start()
                await old.send(command_for("job-before"))
                await new.start()  # fences ``old``
                for job in ("job-fenced", "job-fenced-again"):
                    try:
                        await old.send(command_for(job))
                    except Fenced:
                        refused.append(job)
                await new.send(command_for("job-after"))
            finally:
                await old.stop()
                await new.stop()
            return refused, sorted(e.job_id for e in await bus.read([TopicRole.COMMANDS]))

        refused, on_topic = run(go())
        assert refused == ["job-fenced", "job-fenced-again"]
        assert on_topic == ["job-after", "job-before"]
