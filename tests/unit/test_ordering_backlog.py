"""The reorder buffer's backlog hold (``ordering.py``, "Backlog hold"): agents cut off from the
broker together and draining their spools one after another lose nothing and are not found
silent; a node that died meanwhile is still found silent, ``BACKLOG_HOLD_US`` later; the hold
only ever holds the watermark back."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.rules_support import T0, S
from trainguard.bus.headers import SPOOLED_HEADER, SPOOLED_REPORT_MS, spooled_header, spooled_us
from trainguard.events.envelope import Event
from trainguard.events.payloads import Verdict, VerdictState
from trainguard.rules import RuleEngine, load_default_rules
from trainguard.rules.engine import BACKLOG_HOLD_US, BACKLOG_US, LANE_OF
from trainguard.rules.ordering import ReorderBuffer
from trainguard.rules.synth import step_report, telemetry

pytestmark = pytest.mark.unit
MS = 1000
HAND_OFF_US = 5 * MS  # a live record's spool hand-off


@dataclass(frozen=True)
class Arrival:
    event: Event
    at: int  # when its agent sent it
    spooled: int  # how long it waited in the spool (its header)


def node_records(node: int, start: int, end: int) -> list[Event]:
    """Node ``node``'s records in [start, end): two ranks stepping 10 times a second, and its
    agent's telemetry twice a second; each stamped by its agent 5 ms after its event time."""
    out: list[Event] = []
    for i in range(start * 10, end * 10):
        t = T0 + i * S // 10
        out += [step_report("j", r, i, t + r, 100.0, world=6, node=f"n{node}")
                for r in (2 * node, 2 * node + 1)]
    out += [telemetry("j", f"n{node}", T0 + i * S // 2 + 7, i) for i in range(start * 2, end * 2)]
    return [e.model_copy(update={"ingest_time": e.event_time + HAND_OFF_US}) for e in out]


def sent(events: list[Event], cut: tuple[int, int], heal_at: int | None) -> list[Arrival]:
    """How an agent sends ``events``: as they come, but those stamped while its link was cut
    (``cut``, seconds of job time) wait in its spool until ``heal_at`` (job seconds; None:
    never) and then go in a burst, a millisecond apart."""
    out: list[Arrival] = []
    lo, hi = T0 + cut[0] * S, T0 + cut[1] * S
    burst = 0
    for e in sorted(events, key=lambda e: (e.ingest_time or 0, e.event_id)):
        ingest = e.ingest_time or e.event_time
        if lo <= ingest < hi:
            if heal_at is None:
                continue
            at = T0 + heal_at * S + burst * MS
            burst += 1
            out.append(Arrival(e, at, at - ingest))
        else:
            out.append(Arrival(e, ingest, 0))
    return out


def head_partition() -> list[Arrival]:
    """Three nodes live for 30 s, then all cut off from the broker for 60 s. n0's agent gets
    through first, at 90 s; n1's 3 s later; n2 died at 60 s, cut off, and never sends its
    backlog. The worker reads the records as they arrive."""
    arrivals = (sent(node_records(0, 0, 120), (30, 90), 90)
                + sent(node_records(1, 0, 120), (30, 90), 93)
                + sent(node_records(2, 0, 60), (30, 90), None))
    return sorted(arrivals, key=lambda a: (a.at, a.event.event_id))


def feed_buffer(buffer: ReorderBuffer, arrivals: list[Arrival]) -> list[str]:
    got: list[str] = []
    for a in arrivals:
        got += [e.event_id for e in buffer.push(a.event, LANE_OF.get(a.event.type), a.spooled)]
    return got


def held() -> ReorderBuffer:
    return ReorderBuffer(2 * S, 10 * S, ("task", "telemetry"), 5 * S,
                         backlog_us=BACKLOG_US, hold_us=BACKLOG_HOLD_US)


def test_agents_draining_one_after_another_lose_nothing() -> None:
    arrivals = head_partition()
    kept = {a.event.event_id for a in arrivals}
    buffer = held()
    got = feed_buffer(buffer, arrivals) + [e.event_id for e in buffer.drain()]
    assert buffer.late == 0
    assert sorted(got) == sorted(kept)
    # without the hold, n1's minute arrives behind n0's and is dropped as late
    plain = ReorderBuffer(2 * S, 10 * S, ("task", "telemetry"), 5 * S)
    feed_buffer(plain, arrivals)
    assert plain.late > 1000
    # the node that never drained holds the watermark back no longer than the hold after
    # the last drain (n1's, 3 s after n0's), then the others' event time moves it on
    last_live = max(a.at for a in arrivals)
    assert buffer.watermark >= last_live - BACKLOG_HOLD_US - 3 * S - 2 * S


def silent_nodes(arrivals: list[Arrival]) -> dict[str, int]:
    engine = RuleEngine("j", load_default_rules(), backlog_hold=True)
    out: dict[str, int] = {}
    for a in arrivals:
        for v in engine.feed(a.event, a.spooled):
            p = v.payload
            if isinstance(p, Verdict) and p.kind == "node_silent" and p.state is VerdictState.OPEN:
                out.setdefault(str(v.subject.node), p.first_anomalous_time)
    return out


def test_only_the_node_that_died_is_found_silent() -> None:
    arrivals = head_partition()
    found = silent_nodes(arrivals)
    assert set(found) == {"n2"}
    assert found["n2"] >= T0 + 29 * S  # its last record the loop got: just before the cut
    # the same arrivals with their spool waits unknown: the drains look live, and the node
    # that drained second is found silent too (what the hold is for)
    blind = [Arrival(a.event, a.at, 0) for a in arrivals]
    assert set(silent_nodes(blind)) == {"n1", "n2"}


def test_a_hold_survives_a_restart() -> None:
    arrivals = head_partition()
    whole = held()
    expected = feed_buffer(whole, arrivals)
    mid = next(i for i, a in enumerate(arrivals) if a.spooled) + 500  # inside the hold
    first = held()
    got = feed_buffer(first, arrivals[:mid])
    again = held()
    doc = first.snapshot()
    again.restore(doc)
    assert again.hold_until == first.hold_until > again.arrival
    got += feed_buffer(again, arrivals[mid:])
    assert got == expected


@st.composite
def arrival_orders(draw: st.DrawFn) -> list[Arrival]:
    """Records of two nodes, some of each a backlog (a random spool wait), in an arrival order
    a little shuffled."""
    events = node_records(0, 0, 6) + node_records(1, 0, 6)
    out: list[Arrival] = []
    for e in events:
        ingest = e.ingest_time or e.event_time
        wait = draw(st.sampled_from([0, 0, 0, 0, BACKLOG_US // 2, BACKLOG_US, 3 * S, 20 * S]))
        out.append(Arrival(e, ingest + wait, wait))
    jitter = draw(st.lists(st.integers(0, 3 * S), min_size=len(out), max_size=len(out)))
    return [a for a, _ in sorted(zip(out, jitter, strict=True),
                                 key=lambda p: (p[0].at + p[1], p[0].event.event_id))]


@settings(max_examples=60, deadline=None)
@given(arrivals=arrival_orders())
def test_the_hold_only_holds_back(arrivals: list[Arrival]) -> None:
    """Whatever the arrivals, the hold releases in order, and keeps every record the buffer
    without it keeps (its watermark is never ahead)."""
    plain = ReorderBuffer(2 * S, 10 * S, ("task", "telemetry"), 5 * S)
    buffer = held()
    out_plain = feed_buffer(plain, arrivals) + [e.event_id for e in plain.drain()]
    by_id = {a.event.event_id: a.event for a in arrivals}
    out = feed_buffer(buffer, arrivals) + [e.event_id for e in buffer.drain()]
    keys = [(by_id[i].event_time, i) for i in out]
    assert keys == sorted(keys)
    assert set(out_plain) <= set(out)
    assert buffer.late <= plain.late


@settings(max_examples=200, deadline=None)
@given(headers=st.one_of(
    st.none(),
    st.lists(st.tuples(st.sampled_from([SPOOLED_HEADER, "other", ""]), st.binary(max_size=16)),
             max_size=3),
    st.dictionaries(st.sampled_from([SPOOLED_HEADER, "x"]), st.binary(max_size=16))))
def test_any_headers_read_as_a_wait_or_none(headers: object) -> None:
    got = spooled_us(headers)  # type: ignore[arg-type]
    assert got >= 0 and got % 1000 == 0


@given(waited=st.integers(0, 10**10))
def test_a_written_wait_reads_back(waited: int) -> None:
    expected = waited * 1000 if waited >= SPOOLED_REPORT_MS else 0
    assert spooled_us(spooled_header(waited)) == expected


def test_a_node_cut_off_alone_holds_the_job_once_at_most() -> None:
    """One agent cut off while the others go on: its backlog is behind the watermark, late
    whatever happens, and holds nothing; only its last records, within the lateness bound of
    the watermark, may: the job's watermark then stands still for the hold once, no longer."""
    arrivals = sorted(sent(node_records(0, 0, 120), (30, 90), 90)
                      + sent(node_records(1, 0, 120), (0, 0), None),
                      key=lambda a: (a.at, a.event.event_id))
    buffer = held()
    feed_buffer(buffer, arrivals)
    assert buffer.late > 1000  # n0's minute, as without the hold
    assert buffer.hold_until <= T0 + 90 * S + 2 * S + BACKLOG_HOLD_US
    assert buffer.watermark >= max(a.event.event_time for a in arrivals) - 3 * S
