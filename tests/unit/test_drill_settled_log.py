"""The drill reads a scenario's log only once the incident service has decided its tail."""

from __future__ import annotations

import pytest

from trainguard.drills.runner import settled_log
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentState, IncidentTransition

pytestmark = pytest.mark.unit


def transition(seq: int) -> Event:
    return make_event(IncidentTransition(incident_id="inc", seq=seq, from_state=None,
                                         to_state=IncidentState.DETECTED, reason="r"),
                      event_id=f"transition-{seq}", job_id="j", event_time=1_000 + seq,
                      source="test")


class FakeLog:
    """Transition k is on the log from second ``arrivals[k]``; time moves only by sleeping."""

    def __init__(self, arrivals: list[float]) -> None:
        self.arrivals = arrivals
        self.now = 0.0
        self.reads = 0

    def read(self) -> list[Event]:
        self.reads += 1
        return [transition(k) for k, t in enumerate(self.arrivals) if t <= self.now]

    def sleep(self, s: float) -> None:
        self.now += s


def test_it_waits_until_no_transition_came_for_the_quiet_time() -> None:
    log = FakeLog([0.0, 2.0, 5.0])  # the closing transitions come after the teardown
    events = settled_log(log.read, quiet_s=4.0, clock=lambda: log.now, sleep=log.sleep)
    assert len(events) == 3 and log.now >= 9.0


def test_a_log_that_never_settles_is_read_at_the_limit() -> None:
    log = FakeLog([float(k) for k in range(100)])  # one more every second
    events = settled_log(log.read, quiet_s=4.0, limit_s=20.0, clock=lambda: log.now,
                         sleep=log.sleep)
    assert log.now == pytest.approx(20.0) and len(events) == 21
