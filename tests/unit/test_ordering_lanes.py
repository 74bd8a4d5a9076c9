"""Lanes of the reorder buffer: inputs read side by side and not in step with each other lose
nothing; a stopped input holds the others back for ``idle_us`` of event time at most."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.rules_support import T0, S
from trainguard.events.envelope import Event
from trainguard.rules.engine import LANE_EXPECT_US, LANE_IDLE_US
from trainguard.rules.ordering import ReorderBuffer
from trainguard.rules.synth import step_report, telemetry

pytestmark = pytest.mark.unit
LATENESS = 2 * S
IDLE = LANE_IDLE_US
EXPECT = ("task", "telemetry")
EXPECT_US = LANE_EXPECT_US


def lanes(span_s: int) -> tuple[list[Event], list[Event]]:
    """A dense lane (4 ranks, 10 steps a second) and a sparse one (a node, 2 a second)."""
    task = [step_report("j", r, i, T0 + i * S // 10 + r, 100.0)
            for i in range(span_s * 10) for r in range(4)]
    tele = [telemetry("j", "n0", T0 + i * S // 2 + 7, i) for i in range(span_s * 2)]
    return task, tele


Lane = tuple[list[Event], str]


def in_turns(first: Lane, second: Lane, take: list[int]) -> list[tuple[Event, str]]:
    """A catch-up's arrival: the two inputs read in turns, ``take`` records at a time from
    each (faust's round robin is 1, 1, ...), each input in its own order."""
    (one, one_lane), (two, two_lane) = first, second
    out: list[tuple[Event, str]] = []
    a, b, i = 0, 0, 0
    while a < len(one) or b < len(two):
        n = take[i % len(take)] if take else 1
        out += [(e, one_lane) for e in one[a:a + n]]
        out += [(e, two_lane) for e in two[b:b + n]]
        a, b, i = a + n, b + n, i + 1
    return out


def push_all(buffer: ReorderBuffer, arrivals: list[tuple[Event, str]], *,
             use_lanes: bool = True) -> list[str]:
    got: list[str] = []
    for e, lane in arrivals:
        got += [x.event_id for x in buffer.push(e, lane if use_lanes else None)]
    return got


def feed(buffer: ReorderBuffer, arrivals: list[tuple[Event, str]], *,
         use_lanes: bool = True) -> list[str]:
    """Every arrival, then the end of the log (drain)."""
    got = push_all(buffer, arrivals, use_lanes=use_lanes)
    return got + [x.event_id for x in buffer.drain()]


def ordered(*streams: list[Event]) -> list[str]:
    return [e.event_id for e in sorted((e for s in streams for e in s),
                                       key=lambda e: (e.event_time, e.event_id))]


# The first turn's chunk of the sparse lane (2 records a second) must span less than EXPECT_US
# (the other lane, not seen yet, holds that long); later turns may take any chunk.
FIRST_TURN = st.integers(1, 10)


@settings(max_examples=40, deadline=None)
@given(span=st.integers(2, 8), first=FIRST_TURN,
       more=st.lists(st.integers(1, 40), max_size=4), sparse_first=st.booleans())
def test_inputs_read_in_turns_lose_nothing(span: int, first: int, more: list[int],
                                           sparse_first: bool) -> None:
    take = [first, *more]
    task, tele = lanes(span)  # read in turns, the sparse lane ends < span s (< IDLE) ahead
    dense, sparse = (task, "task"), (tele, "telemetry")
    one, two = (sparse, dense) if sparse_first else (dense, sparse)
    buffer = ReorderBuffer(LATENESS, IDLE, EXPECT, EXPECT_US)
    assert feed(buffer, in_turns(one, two, take)) == ordered(task, tele)
    assert buffer.late == 0


def test_a_lane_not_seen_yet_holds_the_start_for_expect_us_only() -> None:
    task, _ = lanes(10)  # a job with no telemetry at all
    buffer = ReorderBuffer(LATENESS, IDLE, EXPECT, EXPECT_US)
    first = task[0].event_time
    for e in task:
        buffer.push(e, "task")
        if e.event_time - first <= EXPECT_US:
            assert buffer.watermark < first - LATENESS + 1
        else:
            assert buffer.watermark == e.event_time - LATENESS


def test_without_lanes_the_same_catch_up_drops_the_dense_input() -> None:
    task, tele = lanes(10)
    buffer = ReorderBuffer(LATENESS)
    got = feed(buffer, in_turns((tele, "telemetry"), (task, "task"), [1]), use_lanes=False)
    assert buffer.late > 200 and len(got) < len(task) + len(tele)


def test_a_stopped_lane_holds_the_watermark_for_the_idle_span_only() -> None:
    task, tele = lanes(5)  # the job's steps end at ~5 s; its node's telemetry goes on
    tele += [telemetry("j", "n0", T0 + i * S // 2 + 7, i) for i in range(10, 100)]
    buffer = ReorderBuffer(LATENESS, IDLE, EXPECT, EXPECT_US)
    released: list[Event] = []
    for e in task:
        released += buffer.push(e, "task")
    last_step = task[-1].event_time
    for e in tele:
        released += buffer.push(e, "telemetry")
        ahead = e.event_time - last_step
        if ahead < IDLE:  # the task lane still counts: nothing after its last step moves
            assert buffer.watermark <= last_step - LATENESS
        else:  # idle: the telemetry drives the watermark alone
            assert buffer.watermark == e.event_time - LATENESS
    assert [x.event_id for x in released] == ordered(task, tele)[:len(released)]


@settings(max_examples=20, deadline=None)
@given(cut=st.floats(0.0, 1.0), first=FIRST_TURN, more=st.lists(st.integers(1, 20), max_size=3))
def test_lanes_survive_a_snapshot(cut: float, first: int, more: list[int]) -> None:
    take = [first, *more]
    task, tele = lanes(6)
    arrivals = in_turns((tele, "telemetry"), (task, "task"), take)
    at = int(cut * len(arrivals))
    buffer = ReorderBuffer(LATENESS, IDLE, EXPECT, EXPECT_US)
    got = push_all(buffer, arrivals[:at])
    restored = ReorderBuffer(LATENESS, IDLE, EXPECT, EXPECT_US)
    doc = orjson.loads(orjson.dumps(buffer.snapshot()))
    restored.restore(doc)
    assert restored.lanes == buffer.lanes
    got += feed(restored, arrivals[at:])
    assert got == ordered(task, tele) and restored.late == 0
