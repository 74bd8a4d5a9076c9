"""decide as a group (issue 15): an instance is active for the jobs whose commands partition it
holds (``Bus.lease``) and a hot standby for the rest. On the in-memory bus, whose lease is the
twin of Kafka's group assignment (the bus contract checks both): no command is issued twice,
none is lost when the active instance dies before publishing, and two instances split the jobs.
The same on the real broker with two ``trainguard decide`` processes and a SIGKILL:
``tests/integration/test_decide_standby.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tests import keys
from trainguard.actuators import signing
from trainguard.actuators.decider import Decider, DeciderOptions
from trainguard.actuators.policy import PolicyConfig
from trainguard.bus.memory import MemoryBus, MemoryLease
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    Command,
    CommandAction,
    PoolUnit,
    Severity,
    UnitState,
    Verdict,
    VerdictKind,
    VerdictState,
)
from trainguard.events.topics import TopicRole

pytestmark = pytest.mark.unit
T = 1_800_000_000_000_000
GROUP = "tg-decide"
OPTS = DeciderOptions(key=keys.COMMAND, actuators=keys.ACTUATOR_PUBS,
                      policy=PolicyConfig(settle_s=0), tick_s=0.02, group_id=GROUP)


def job_events(job: str, t: int = T) -> list[Event]:
    """Rank 1 of ``job`` killed at ``t``, a spare free: decide's answer is one migrate."""
    def unit(name: str, state: UnitState, rank: int | None, pid: int | None) -> Event:
        return make_event(PoolUnit(unit=name, state=state, node="n1", rank=rank, pid=pid,
                                   epoch=1 if rank is not None else None),
                          event_id=derived_id("u", job, name, state.value), job_id=job,
                          event_time=t, source="test", subject=Subject(unit=name))

    v = Verdict(verdict_id=derived_id("v", job), rule="process_exit",
                kind=VerdictKind.PROCESS_EXIT, state=VerdictState.OPEN,
                severity=Severity.CRITICAL, first_anomalous_time=t, decided_time=t,
                evidence={"pid": 101, "signal": 9})
    verdict = make_event(v, event_id=derived_id("ev", job), job_id=job, event_time=t,
                         source="test", subject=Subject(rank=1, node="n1"))
    return signing.sign_log([unit("u0", UnitState.BOUND, 0, 100),
                             unit("u1", UnitState.BOUND, 1, 101),
                             unit("spare", UnitState.SPARE, None, None), verdict],
                            keys.COMMAND, keys.ACTUATOR)


def commands(bus: MemoryBus) -> list[Command]:
    return [e.payload for e in bus.events(TopicRole.COMMANDS) if isinstance(e.payload, Command)]


def job_on(bus: MemoryBus, partition: int) -> str:
    """A job whose commands go to ``partition``."""
    topic = bus.names.name(TopicRole.COMMANDS)
    return next(job for i in range(1000) if bus.partition_for(
        topic, (job := f"job-{i}").encode()) == partition)


async def until(done: Callable[[], bool], limit_s: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not done() and loop.time() < deadline:
        await asyncio.sleep(0.02)
    return done()


def run(coro: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))


def test_a_standby_keeps_what_it_decides_and_publishes_it_when_the_active_one_dies() -> None:
    bus = MemoryBus()
    job = job_on(bus, 0)  # held by the first member of the group

    async def go() -> None:
        dead = bus.lease(TopicRole.COMMANDS, group_id=GROUP, name="killed")
        await dead.start()  # the active instance, killed before it published anything
        standby = Decider(bus, OPTS)
        stop = asyncio.Event()
        task = asyncio.create_task(standby.run(stop))
        await bus.publish(job_events(job))
        assert await until(lambda: bool(standby.standing))
        await asyncio.sleep(0.3)  # many ticks
        assert commands(bus) == []  # a standby publishes nothing for a job it does not hold
        assert not standby.active(job)
        bus.expire(dead)  # its session times out: the group gives its partitions over
        assert await until(lambda: bool(commands(bus)))
        await asyncio.sleep(0.3)
        stop.set()
        await task
        assert standby.standing == {}

    run(go())
    (cmd,) = commands(bus)
    assert cmd.action is CommandAction.MIGRATE and cmd.cause_verdict_ids == [derived_id("v", job)]


def test_a_command_the_active_one_published_is_not_issued_again_after_a_take_over() -> None:
    bus = MemoryBus()
    job = job_on(bus, 0)

    async def go() -> None:
        dead = bus.lease(TopicRole.COMMANDS, group_id=GROUP, name="active")
        await dead.start()
        standby = Decider(bus, OPTS)
        stop = asyncio.Event()
        task = asyncio.create_task(standby.run(stop))
        await bus.publish(job_events(job))
        assert await until(lambda: bool(standby.standing))
        # the active instance publishes the same decision (what decide publishes), then dies
        publisher = Decider(bus, OPTS)
        publisher.producer = bus.producer()
        await publisher.producer.start()
        await publisher.publish(list(standby.standing.values()), {})
        assert await until(lambda: not standby.standing)  # read back: no longer standing
        bus.expire(dead)
        assert await until(lambda: standby.active(job))
        await asyncio.sleep(0.3)  # many ticks
        stop.set()
        await task

    run(go())
    assert len(commands(bus)) == 1


def test_two_instances_split_the_jobs_and_each_job_gets_one_command() -> None:
    bus = MemoryBus()
    jobs = [job_on(bus, p) for p in (0, 1, 2)]

    async def go() -> None:
        a, b = Decider(bus, OPTS), Decider(bus, OPTS)
        stops = [asyncio.Event(), asyncio.Event()]
        tasks = [asyncio.create_task(a.run(stops[0]))]
        assert await until(lambda: a.lease is not None and bool(a.lease.held()))
        tasks.append(asyncio.create_task(b.run(stops[1])))
        assert await until(lambda: b.lease is not None and bool(b.lease.held()))
        for job in jobs:
            await bus.publish(job_events(job))
        assert await until(lambda: len(commands(bus)) >= 3)
        await asyncio.sleep(0.3)
        assert sorted(j for j in jobs if a.active(j)) == sorted([jobs[0], jobs[2]])
        assert [j for j in jobs if b.active(j)] == [jobs[1]]
        for s in stops:
            s.set()
        await asyncio.gather(*tasks)

    run(go())
    got = commands(bus)
    assert len(got) == 3 and len({c.idempotency_key for c in got}) == 3


def test_an_instance_whose_session_expired_but_still_runs_is_fenced() -> None:
    """The active instance paused (or cut off from the group) past its session: the group
    gives its partitions to another member, which starts its fenced producers, while the old
    one, once it runs again, still believes it holds them. Its send is refused: nothing of it
    reaches the topic, what it decided waits as a standby's, and it does not take the
    partition back while its stale lease still says it holds it. (The new holder is played by
    its fenced producer alone, so that the old one surely decides first; two instances on the
    real broker: tests/integration/test_decide_standby.py.)"""
    bus = MemoryBus()
    job = job_on(bus, 0)

    async def go() -> Decider:
        old = Decider(bus, OPTS)
        stop = asyncio.Event()
        task = asyncio.create_task(old.run(stop))
        # its lease joined and its fenced producer for the job's partition is started (before
        # run() sets the lease, ``active`` is True for every job)
        assert await until(lambda: old.lease is not None and old.active(job))
        assert isinstance(old.lease, MemoryLease)
        bus.expire(old.lease)  # ``old`` still runs and believes it holds its partitions
        holder = bus.fenced_producer(f"{GROUP}-p0")
        await holder.start()  # what the new holder does first
        await bus.publish(job_events(job))
        assert await until(lambda: bool(old.fenced_out))
        await asyncio.sleep(0.3)  # many ticks: it does not fence the holder back
        stop.set()
        await task
        await holder.send(make_event(Command(
            command_id="c-holder", idempotency_key="k-holder",
            action=CommandAction.RAISE_QUOTA, tier=1, issued_at=T, issued_by="test",
            params={"rank": 1}),
            event_id="c-holder", job_id=job, event_time=T, source="test",
            subject=Subject(rank=1)))  # the holder's fence still stands
        return old

    old = asyncio.run(asyncio.wait_for(go(), 60))
    assert old.fenced_out == {0} and not old.active(job)
    assert [c.command_id for c in commands(bus)] == ["c-holder"]  # nothing of ``old``
    assert [d.command.action for d in old.standing.values()] == [CommandAction.MIGRATE]
