"""Hang by section: learned bounds per section, the verdict names where the rank stopped."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.rules_support import RULES, T0, S, kinds, run
from trainguard.events.envelope import Event
from trainguard.events.payloads import Section, Verdict, VerdictKind
from trainguard.rules import RuleEngine
from trainguard.rules.synth import section_heartbeat, step_report

pytestmark = pytest.mark.unit
MS = 1000
ORDER = (Section.DATA, Section.FORWARD, Section.BACKWARD, Section.OPTIMIZER)


def job(durations_ms: list[list[int]], ranks: int = 2, *, hb_ms: int = 1000,
        stop: tuple[int, int, Section] | None = None, tail_s: int = 0) -> list[Event]:
    """Ranks running steps whose sections (ORDER) take ``durations_ms[step][i]`` ms, with a
    heartbeat every ``hb_ms`` showing the section in progress. ``stop`` = (rank, step,
    section): that rank enters that section of that step and never leaves it (its heartbeats
    go on: the process is alive), while its peers wait in ``comm`` of the same step."""
    events: list[Event] = []
    for r in range(ranks):
        t = T0 + r  # distinct times per rank
        spans: list[tuple[Section, int, int]] = []  # (section, start, end)
        for step, secs in enumerate(durations_ms):
            stuck_here = stop is not None and stop[1] == step
            for sec, d in zip(ORDER, secs, strict=False):
                if stuck_here and stop is not None and stop[0] == r and sec is stop[2]:
                    spans.append((sec, t, -1))
                    break
                spans.append((sec, t, t + d * MS))
                t += d * MS
            else:
                if stuck_here:  # a peer: waits in the exchange for the stuck rank
                    spans.append((Section.COMM, t, -1))
                else:
                    events.append(step_report("j", r, step, t, float(sum(secs)), world=ranks))
                    t += 1
                    continue
            break
        end = t + tail_s * S if stop is not None else t
        hb = T0 + r + 7
        while hb < end:
            here = [s for s in spans if s[1] <= hb and (s[2] == -1 or hb < s[2])]
            if here:
                events.append(section_heartbeat("j", r, hb, here[-1][0], here[-1][1]))
            else:
                events.append(section_heartbeat("j", r, hb, None, None))
            hb += hb_ms * MS
    return events


def num(v: Verdict, key: str) -> float:
    x = v.evidence[key]
    assert isinstance(x, int | float)
    return x


def stuck(out: list[Event]) -> list[Verdict]:
    return [e.payload for e in out if isinstance(e.payload, Verdict)
            and e.payload.kind is VerdictKind.RANK_STUCK]


durations = st.lists(st.lists(st.integers(1, 4000), min_size=4, max_size=4),
                     min_size=1, max_size=30)


@settings(max_examples=40, deadline=None)
@given(durations)
def test_no_verdict_while_sections_finish_within_their_bound(steps: list[list[int]]) -> None:
    # every section ends well within the initial bound (300 s) and the floor (20 s)
    assert stuck(run(job(steps))) == []


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(200, 3000), min_size=4, max_size=4), min_size=12,
                max_size=16),
       st.integers(0, 1), st.sampled_from(ORDER))
def test_the_verdict_names_the_section_where_the_rank_stopped(
        steps: list[list[int]], rank: int, section: Section) -> None:
    at = len(steps) - 1
    out = stuck(run(job(steps, stop=(rank, at, section), tail_s=400)))
    assert len(out) == 1, out
    v = out[0]
    assert v.evidence["section"] == section.value  # where it stopped, not the peers' comm
    assert v.evidence["peers_waiting_in_comm"] == 1
    # the bound: the initial one, or k x the longest seen (>= the floor) once 10 ended
    timeout_ms = num(v, "timeout_ms")
    if v.evidence["learned"]:
        longest = max(s[ORDER.index(section)] for s in steps[:at])
        assert timeout_ms >= max(20000, 3 * longest)
        assert timeout_ms <= max(20000, 3 * (longest + 1001))  # ends seen ≤ 1 hb late
    else:
        assert timeout_ms == 300000
    assert num(v, "stuck_ms") > timeout_ms


def test_learned_bound_is_faster_than_the_initial_one_and_names_the_rank() -> None:
    steps = [[100, 200, 1500, 100]] * 30  # backward ~1.5 s, seen by heartbeats
    out = run(job(steps, ranks=4, stop=(2, 29, Section.BACKWARD), tail_s=120))
    v = stuck(out)
    assert len(v) == 1
    assert v[0].evidence["learned"] is True and v[0].evidence["timeout_ms"] == 20000  # floor
    opened = next(e for e in out if isinstance(e.payload, Verdict)
                  and e.payload.kind is VerdictKind.RANK_STUCK)
    assert opened.subject.rank == 2 and isinstance(opened.payload, Verdict)
    assert 20 * S < opened.event_time - opened.payload.first_anomalous_time <= 22 * S


def test_a_long_backward_learns_a_longer_bound() -> None:
    fast = [[100, 200, 1500, 100]] * 15
    slow = [[100, 200, 12000, 100]] * 15  # 12 s backward: 3 x 12 s = 36 s > the floor
    out = stuck(run(job(fast + slow, stop=(0, 29, Section.BACKWARD), tail_s=200)))
    assert len(out) == 1 and out[0].evidence["learned"] is True
    assert 36000 <= num(out[0], "timeout_ms") <= 39100


def test_checkpoint_is_judged_on_its_own_initial_bound() -> None:
    steps = [[100, 200, 1500, 100]] * 20
    ev = job(steps)
    end = max(e.event_time for e in ev)
    # a 10-minute checkpoint: longer than the learned bounds of the step's sections, and than
    # their initial bound, but within the checkpoint's own initial bound (30 min)
    start = end + S
    ev += [section_heartbeat("j", r, start + k * S + r, Section.CHECKPOINT, start)
           for r in range(2) for k in range(600)]
    ev += [section_heartbeat("j", r, start + 601 * S + r, None, None) for r in range(2)]
    assert stuck(run(ev)) == []


def test_all_ranks_in_comm_is_a_hang_of_the_exchange() -> None:
    start = T0 + S
    ev = [section_heartbeat("j", r, start + k * S + r, Section.COMM, start + r)
          for r in range(3) for k in range(320)]
    out = stuck(run(ev))
    assert [v.evidence["section"] for v in out] == ["comm"] * 3


def test_a_new_section_resolves_and_replay_is_deterministic() -> None:
    ev = job([[100, 200, 1500, 100]] * 20, stop=(1, 19, Section.BACKWARD), tail_s=40)
    end = max(e.event_time for e in ev)
    ev.append(section_heartbeat("j", 1, end + S, Section.OPTIMIZER, end + S - 10))
    out = run(ev)
    assert [k for k in kinds(out) if k[0] == "rank_stuck"] == [
        ("rank_stuck", "open"), ("rank_stuck", "resolved")]
    again = run(list(reversed(ev)))
    assert [e.event_id for e in again] == [e.event_id for e in out]


def test_snapshot_and_restore_continue_the_same() -> None:
    ev = sorted(job([[100, 200, 1500, 100]] * 20, stop=(1, 19, Section.BACKWARD), tail_s=40),
                key=lambda e: (e.event_time, e.event_id))
    whole = RuleEngine("j", RULES)
    ref = [o for e in ev for o in whole.feed(e)] + whole.flush()
    half = len(ev) // 2
    a = RuleEngine("j", RULES)
    got = [o for e in ev[:half] for o in a.feed(e)]
    b = RuleEngine("j", RULES, a.snapshot())
    got += [o for e in ev[half:] for o in b.feed(e)] + b.flush()
    assert [e.event_id for e in got] == [e.event_id for e in ref]
    assert stuck(ref)
