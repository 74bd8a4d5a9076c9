"""The service's publisher: each transition once; an id already published with other content is
counted as a conflict and not sent again. (The producer is an in-memory fake; the service
against the real broker is in tests/integration/test_incident_service.py.)"""

from __future__ import annotations

import asyncio
from typing import Any

from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentTransition
from trainguard.incidents import rebuild
from trainguard.incidents.query import canonical
from trainguard.incidents.service import Publisher, ServiceStats
from trainguard.incidents.synth import incident_log

TRANSITIONS = rebuild(incident_log())


class FakeProducer:
    def __init__(self) -> None:
        self.sent: list[Event] = []

    async def enqueue(self, event: Event) -> Any:
        self.sent.append(event)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def test_each_transition_is_published_once_and_conflicts_are_counted() -> None:
    async def run() -> tuple[FakeProducer, ServiceStats]:
        producer = FakeProducer()
        stats = ServiceStats()
        first = TRANSITIONS[0]
        p = first.payload
        assert isinstance(p, IncidentTransition)
        other = first.model_copy(update={"payload": p.model_copy(update={"reason": "else"})})
        known = {first.event_id: canonical(other)}  # on the topic, with other content
        pub = Publisher(producer, known, stats)
        await pub.publish(TRANSITIONS)
        await pub.publish(TRANSITIONS[:3])  # a replayed batch
        return producer, stats

    producer, stats = asyncio.run(run())
    assert [e.event_id for e in producer.sent] == [e.event_id for e in TRANSITIONS[1:]]
    assert stats.published == len(TRANSITIONS) - 1
    assert stats.already_published == 1 + 3 and stats.conflicts == 2
