"""The drill runner looks at the loop when the log tail brings events, not on a timer: at
most every ``LOOK_MIN_S``, at least every ``LOOK_MAX_S``, never past a deadline."""

from __future__ import annotations

import threading
import time

import pytest

from tests.unit.test_drill_settled_log import transition
from trainguard.bus.config import KafkaConfig
from trainguard.drills import runner
from trainguard.drills.logtail import LogTail
from trainguard.drills.runner import Looks

pytestmark = pytest.mark.unit


@pytest.fixture
def tail(monkeypatch: pytest.MonkeyPatch) -> LogTail:
    monkeypatch.setattr(runner, "LOOK_MIN_S", 0.05)
    monkeypatch.setattr(runner, "LOOK_MAX_S", 2.0)
    return LogTail(KafkaConfig(bootstrap="127.0.0.1:9"), "j")  # never started: fed by hand


def _later(tail: LogTail, after_s: float, seq: int) -> threading.Timer:
    timer = threading.Timer(after_s, lambda: tail.add([transition(seq)]))
    timer.start()
    return timer


def test_an_event_wakes_the_runner_at_once(tail: LogTail) -> None:
    looks = Looks(tail)
    _later(tail, 0.2, 1)
    t0 = time.monotonic()
    looks.next()
    assert 0.15 < time.monotonic() - t0 < 1.0  # not the 2 s of a look without events
    assert looks.seen == 1


def test_without_events_it_looks_after_the_longest_interval_or_the_deadline(
        tail: LogTail) -> None:
    looks = Looks(tail)
    t0 = time.monotonic()
    looks.next(until=t0 + 0.3)
    assert 0.25 < time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    looks.next()
    assert 1.9 < time.monotonic() - t0 < 3.0


def test_a_stream_of_events_is_looked_at_no_more_often_than_the_shortest_interval(
        tail: LogTail) -> None:
    looks = Looks(tail)
    stop = threading.Event()

    def flood() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            tail.add([transition(n)])
            time.sleep(0.005)

    threading.Thread(target=flood, daemon=True).start()
    try:
        t0 = time.monotonic()
        for _ in range(6):
            looks.next()
        took = time.monotonic() - t0
    finally:
        stop.set()
    assert took >= 5 * 0.05  # six looks, at least LOOK_MIN_S apart


def test_wait_until_returns_when_the_events_satisfy_it_or_at_its_limit(tail: LogTail) -> None:
    _later(tail, 0.1, 1)
    _later(tail, 0.2, 2)
    t0 = time.monotonic()
    assert tail.wait_until(lambda events: len(events) >= 2, 5.0)
    assert time.monotonic() - t0 < 1.0  # woken by the second event, not by a timer
    t0 = time.monotonic()
    assert not tail.wait_until(lambda events: len(events) >= 3, 0.3)
    assert 0.25 < time.monotonic() - t0 < 1.0
