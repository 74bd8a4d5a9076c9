"""Only trusted commands act, against the real broker: a forged or unsigned command is
dead-lettered with the reason (no outcome: it names a key it has no right to); a stale and a
replayed one are refused; the rank they targeted keeps running."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import psutil
from aiokafka import AIOKafkaConsumer

from tests import keys
from tests.integration.conftest import arun
from tests.integration.test_fencing import job_spec, reap
from trainguard.actuators.local import LocalBackend
from trainguard.actuators.service import Actuator, ActuatorOptions
from trainguard.actuators.signing import PrivateKey, sign
from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import EventConsumer
from trainguard.bus.dlq import DeadLetter
from trainguard.bus.kafka import KafkaBus
from trainguard.bus.producer import EventProducer
from trainguard.events.clock import now_us
from trainguard.events.codec import decode, make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import (
    Command,
    CommandAction,
    CommandOutcome,
    OutcomeStatus,
    PoolUnit,
    UnitState,
)
from trainguard.events.topics import TopicNames, TopicRole

KEY = keys.COMMAND


def command(job: str, key: str, action: CommandAction, rank: int, *,
            signed_with: PrivateKey | None,
            issued_at: int | None = None) -> Event:
    cmd = Command(command_id=f"cmd-{key}", idempotency_key=key, action=action, tier=3,
                  issued_at=issued_at or now_us(), issued_by="trainguard-decide",
                  params={"rank": rank, "ranks": [rank]} if action is CommandAction.MIGRATE
                  else {"rank": rank})
    subject = Subject(rank=rank)
    if signed_with is not None:
        cmd = sign(signed_with, job, subject, cmd)
    return make_event(cmd, event_id=f"ev-{key}-{cmd.issued_at}", job_id=job,
                      event_time=cmd.issued_at, source="test", subject=subject)


def finals(events: list[Event]) -> int:
    return sum(isinstance(e.payload, CommandOutcome) and e.payload.status is not
               OutcomeStatus.ACCEPTED for e in events)


async def outcomes_until(cfg: KafkaConfig, count: int, limit_s: float = 40,
                         done: Callable[[list[Event]], bool] | None = None) -> list[Event]:
    """The outcomes topic from the start until ``count`` final outcomes (or ``done``)."""
    reader = EventConsumer(cfg, [TopicRole.OUTCOMES], group_id=None, name="test", dlq=None)
    await reader.start()
    got: list[Event] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    try:
        while loop.time() < deadline:
            got += [d.event for d in await reader.poll(timeout_ms=300)]
            if (done(got) if done is not None else finals(got) >= count):
                break
    finally:
        await reader.stop()
    return got


async def dead_letters(cfg: KafkaConfig, count: int, limit_s: float = 20) -> list[DeadLetter]:
    """The dead-letter topic from the start until ``count`` letters."""
    reader = AIOKafkaConsumer(TopicNames(cfg.topic_prefix).name(TopicRole.DLQ),
                              **cfg.client_kwargs(), group_id=None,
                              auto_offset_reset="earliest", enable_auto_commit=False)
    await reader.start()
    got: list[DeadLetter] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    try:
        while loop.time() < deadline and len(got) < count:
            batches = await reader.getmany(timeout_ms=300)
            got += [DeadLetter.decode(r.value) for recs in batches.values() for r in recs]
    finally:
        await reader.stop()
    return got


def test_forged_stale_and_replayed_commands_are_refused(kafka: KafkaConfig,
                                                        tmp_path: Path) -> None:
    spec = job_spec(tmp_path, world=1, ignore_term=False)
    backend = LocalBackend(tmp_path / "logs", use_cgroups=False)
    actuator = Actuator(KafkaBus(kafka), ActuatorOptions(job=spec, key=keys.COMMAND_PUB,
                                               signer=keys.ACTUATOR,
                                               state_dir=tmp_path / "state",
                                               launch=True, max_age_s=30), backend)
    job = spec.job_id

    async def scenario() -> list[Event]:
        stop = asyncio.Event()
        task = asyncio.create_task(actuator.run(stop))
        while actuator.executor is None or not actuator.executor.pool.bound(job):
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)  # the commands consumer joins its group
        async with EventProducer(kafka) as prod:
            forged = command(job, "k-forged", CommandAction.FENCE, 0,
                             signed_with=PrivateKey.generate())
            await prod.send(forged)
            unsigned = command(job, "k-unsigned", CommandAction.FENCE, 0, signed_with=None)
            await prod.send(unsigned)
            stale = command(job, "k-stale", CommandAction.FENCE, 0, signed_with=KEY,
                            issued_at=now_us() - 120_000_000)
            await prod.send(stale)
            good = command(job, "k-good", CommandAction.RESUME, 0, signed_with=KEY)
            await prod.send(good)
            got = await outcomes_until(kafka, 2)
            await prod.send(good)  # the very same signed bytes again: a replay
            got = await outcomes_until(kafka, 3)
        stop.set()
        await task
        return got

    try:
        events = arun(scenario(), timeout_s=80)
        letters = arun(dead_letters(kafka, 2))
    finally:
        if actuator.executor is not None:
            for rep in actuator.executor.replicas().values():
                reap(rep.pid)
    outcomes = [e.payload for e in events if isinstance(e.payload, CommandOutcome)]
    by_key: dict[str, list[tuple[OutcomeStatus, str]]] = {}
    for o in outcomes:
        by_key.setdefault(o.idempotency_key, []).append((o.status, o.detail))
    assert "k-forged" not in by_key and "k-unsigned" not in by_key
    reasons = {}
    for letter in letters:
        cmd = decode(letter.original_value()).payload
        assert isinstance(cmd, Command) and letter.consumer == "actuator"
        reasons[cmd.idempotency_key] = letter.reason
    assert "command signature: key" in reasons["k-forged"]
    assert "is not trusted" in reasons["k-forged"]
    assert reasons["k-unsigned"] == "payload.signature: command unsigned (got None)"
    assert by_key["k-stale"][0][0] is OutcomeStatus.REFUSED
    assert by_key["k-stale"][0][1].startswith("stale: issued 1")
    statuses = [s for s, _ in by_key["k-good"]]
    assert statuses == [OutcomeStatus.ACCEPTED, OutcomeStatus.DONE, OutcomeStatus.REFUSED]
    assert "replayed: idempotency key already used" in by_key["k-good"][2][1]
    # the forged/stale fences did nothing; the one good resume acted exactly once
    units = [e.payload for e in events if isinstance(e.payload, PoolUnit)]
    bound = [u for u in units if u.state is UnitState.BOUND]
    assert [u.epoch for u in bound] == [1, 2]
    assert len([u for u in units if u.state is UnitState.FENCED]) == 1
    assert bound[-1].pid is not None and psutil.pid_exists(bound[-1].pid)
