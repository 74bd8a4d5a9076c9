"""The actuator publishes its events from one queue; a publisher that fails (the broker refused
a send) must surface as an error where the actuator waits for its events, never as a hang."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from tests import keys
from trainguard.actuators.backend import Backend
from trainguard.actuators.jobspec import parse_job_spec
from trainguard.actuators.service import Actuator, ActuatorOptions
from trainguard.bus.memory import MemoryBus
from trainguard.bus.protocol import EventSink
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event
from trainguard.events.payloads import CommandAction, CommandOutcome, OutcomeStatus

SPEC = {"job_id": "j", "world_size": 1, "ckpt_dir": "/data/ckpt",
        "command": ["python", "-m", "w", "--rank", "{rank}"],
        "units": [{"name": "u0", "cpus": [0], "rank": 0}]}


class Producer:
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.sent: list[Event] = []

    async def send(self, event: Event) -> Any:
        if self.fail:
            raise ConnectionError("broker refused the send")
        self.sent.append(event)


def outcome() -> Event:
    return make_event(CommandOutcome(command_id="c", idempotency_key="k",
                                     action=CommandAction.MIGRATE, status=OutcomeStatus.DONE),
                      event_id="event-0001", job_id="j", event_time=1, source="test")


def actuator(tmp_path: Path, producer: Producer) -> Actuator:
    act = Actuator(MemoryBus("t"),
                   ActuatorOptions(job=parse_job_spec(SPEC), key=keys.COMMAND_PUB,
                                   signer=keys.ACTUATOR, state_dir=tmp_path), cast(Backend, None))
    act.producer = cast(EventSink, producer)
    return act


def test_queued_events_are_published_before_the_wait_returns(tmp_path: Path) -> None:
    producer = Producer(fail=False)

    async def go() -> None:
        act = actuator(tmp_path, producer)
        act._start_publisher()
        act.queue.put_nowait(outcome())
        await asyncio.wait_for(act._published(), 5)
        act._stop_publisher()

    asyncio.run(go())
    assert [e.event_id for e in producer.sent] == ["event-0001"]


def test_a_failed_publisher_raises_instead_of_hanging(tmp_path: Path) -> None:
    async def go() -> None:
        act = actuator(tmp_path, Producer(fail=True))
        act._start_publisher()
        act.queue.put_nowait(outcome())
        await asyncio.wait_for(act._published(), 5)

    with pytest.raises(ConnectionError, match="broker refused"):
        asyncio.run(go())
