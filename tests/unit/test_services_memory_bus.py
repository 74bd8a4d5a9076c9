"""The decision service and the incident service, whole, on the in-memory bus: what they read,
what they publish, and that a restart publishes nothing twice — without a broker."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from trainguard.actuators.decider import Decider, DeciderOptions
from trainguard.actuators.policy import PolicyConfig
from trainguard.actuators.signing import verify
from trainguard.bus.memory import MemoryBus
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    Command,
    CommandAction,
    MigrateParams,
    PoolUnit,
    Severity,
    UnitState,
    Verdict,
    VerdictKind,
    VerdictState,
)
from trainguard.events.topics import TopicRole
from trainguard.incidents import IncidentSettings, rebuild
from trainguard.incidents.query import canonical
from trainguard.incidents.service import ServiceStats, serve
from trainguard.incidents.synth import incident_log

pytestmark = pytest.mark.unit
JOB = "job-a"
KEY = b"unit-test-command-key-000000001"
T = 1_800_000_000_000_000


async def publish(bus: MemoryBus, events: list[Event]) -> None:
    prod = bus.producer()
    await prod.start()
    for e in events:
        await prod.send(e)
    await prod.stop()


async def run_until(service: Callable[[asyncio.Event], Coroutine[Any, Any, Any]],
                    done: Callable[[], bool], limit_s: float = 20.0) -> Any:
    """Run a service until ``done()`` (or the limit), then stop it; what it returned."""
    stop = asyncio.Event()
    task = asyncio.create_task(service(stop))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    try:
        while not done() and not task.done() and loop.time() < deadline:
            await asyncio.sleep(0.02)
    finally:
        stop.set()
    return await task


# --- decide --------------------------------------------------------------------------------


def _unit(name: str, state: UnitState, rank: int | None, pid: int | None) -> Event:
    return make_event(PoolUnit(unit=name, state=state, node="n1", rank=rank, pid=pid,
                               epoch=1 if rank is not None else None),
                      event_id=derived_id("u", name, state.value), job_id=JOB, event_time=T,
                      source="test", subject=Subject(unit=name))


def _exit_verdict() -> Event:
    v = Verdict(verdict_id="v-exit-1", rule="process_exit", kind=VerdictKind.PROCESS_EXIT,
                state=VerdictState.OPEN, severity=Severity.CRITICAL, first_anomalous_time=T,
                decided_time=T, evidence={"pid": 101, "signal": 9})
    return make_event(v, event_id="ev-verdict-1", job_id=JOB, event_time=T, source="test",
                      subject=Subject(rank=1, node="n1"))


def _commands(bus: MemoryBus) -> list[Event]:
    return [e for e in bus.events(TopicRole.COMMANDS) if isinstance(e.payload, Command)]


def test_decide_reads_the_bus_and_publishes_one_signed_migrate_and_never_twice() -> None:
    bus = MemoryBus()
    opts = DeciderOptions(key=KEY, policy=PolicyConfig(settle_s=0), tick_s=0.02)

    async def go() -> None:
        await publish(bus, [_unit("u0", UnitState.BOUND, 0, 100),
                            _unit("u1", UnitState.BOUND, 1, 101),
                            _unit("spare", UnitState.SPARE, None, None), _exit_verdict()])
        await run_until(Decider(bus, opts).run, lambda: bool(_commands(bus)))
        await asyncio.sleep(0)
        # a restarted service rebuilds from the log and finds the command already issued
        restarted = Decider(bus, opts)
        await run_until(restarted.run, lambda: False, limit_s=1.0)  # many ticks
        assert restarted.state.issued  # it did rebuild its state from the log

    asyncio.run(asyncio.wait_for(go(), 60))
    (ev,) = _commands(bus)
    cmd = ev.payload
    assert isinstance(cmd, Command) and cmd.action is CommandAction.MIGRATE
    assert isinstance(cmd.params, MigrateParams)
    assert cmd.params.ranks == [1] and cmd.params.from_units == ["u1"]
    assert cmd.cause_verdict_ids == ["v-exit-1"]
    assert verify(KEY, ev) is None  # signed by decide's key
    assert ev.ingest_time is not None  # stamped by the producer


# --- incidents -----------------------------------------------------------------------------

LOG = incident_log()
SETTINGS = IncidentSettings()


def _transitions(bus: MemoryBus) -> list[Event]:
    return [e for e in bus.events(TopicRole.INCIDENTS) if e.type == "incident.transition"]


def test_incident_service_publishes_the_rebuilt_transitions_once() -> None:
    expected = rebuild(LOG, SETTINGS)
    assert expected
    bus = MemoryBus()

    async def go() -> tuple[ServiceStats, ServiceStats]:
        await publish(bus, LOG[: len(LOG) // 2])  # half before it starts, half while it runs
        first = ServiceStats()

        async def service(stop: asyncio.Event) -> ServiceStats:
            return await serve(bus, settings=SETTINGS, idle_flush_s=0.2, stop=stop,
                               stats=first)

        stop = asyncio.Event()
        task = asyncio.create_task(service(stop))
        await asyncio.sleep(0.1)
        await publish(bus, LOG[len(LOG) // 2:])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while len(_transitions(bus)) < len(expected) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        await task
        again = ServiceStats()
        await run_until(lambda s: serve(bus, settings=SETTINGS, idle_flush_s=0.2, stop=s,
                                        stats=again),
                        lambda: again.already_published >= len(expected), limit_s=10)
        return first, again

    first, again = asyncio.run(asyncio.wait_for(go(), 90))
    got = _transitions(bus)
    assert sorted(canonical(t) for t in got) == sorted(canonical(t) for t in expected)
    assert first.published == len(expected) and first.batches >= 1  # the live half too
    assert again.published == 0 and again.already_published == len(expected)
    assert len(_transitions(bus)) == len(expected)
