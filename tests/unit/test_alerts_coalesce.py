"""The coalescer: one opening and one closing notice per incident, whatever the storm."""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.alerts.coalesce import Coalescer, plan
from trainguard.alerts.model import NoticeKind, Phase, Transition
from trainguard.alerts.render import group
from trainguard.events.payloads import IncidentState as S

T0 = 1_790_000_000_000_000


def tr(inc: str, seq: int, to: S, frm: S | None = None, *, job: str = "job-a",
       t_us: int | None = None, **kw: object) -> Transition:
    return Transition(incident_id=inc, job_id=job, seq=seq, from_state=frm, to_state=to,
                      event_time_us=T0 + seq * 1_000_000 if t_us is None else t_us,
                      **kw)  # type: ignore[arg-type]


def lifecycle(inc: str, end: S = S.RECOVERED) -> list[Transition]:
    states = [S.DETECTED, S.LOCATED, S.MITIGATING, S.MITIGATING, end]
    prev: S | None = None
    out = []
    for i, s in enumerate(states):
        out.append(tr(inc, i, s, prev, node="n1", rank=3, tier=min(i, 3) or None,
                      reason=f"step {i}"))
        prev = s
    return out


def test_a_quick_lifecycle_is_one_opening_and_one_recovery_with_the_latest_facts() -> None:
    c = Coalescer(hold_s=2.0)
    for t in lifecycle("i1"):
        c.offer(t, now=0.0)
    assert c.due(1.9) == []  # still held
    notices = c.due(2.0)
    assert [n.kind for n in notices] == [NoticeKind.OPENED, NoticeKind.RECOVERED]
    last = notices[-1]
    assert (last.state, last.transitions, last.node, last.rank, last.tier) == (
        S.RECOVERED, 5, "n1", 3, 3)
    assert last.reason == "step 4"
    assert last.opened_at_us == T0 and last.at_us == T0 + 4_000_000
    assert c.due(100.0) == []
    assert not c.pending()


def test_an_incident_the_scheduler_ended_within_the_hold_is_never_told() -> None:
    c = Coalescer(hold_s=2.0)
    quiet = [tr("i1", 0, S.DETECTED), tr("i1", 1, S.LOCATED, S.DETECTED),
             tr("i1", 2, S.ENDED, S.LOCATED)]
    for t in quiet:
        c.offer(t, now=0.0)
    assert c.due(5.0) == [] and not c.pending() and c.firing() == []
    # told before the scheduler ended it: the end is told too, and it is not firing
    c.offer(tr("i2", 0, S.DETECTED), 10.0)
    assert [n.kind for n in c.due(12.0)] == [NoticeKind.OPENED]
    c.offer(tr("i2", 1, S.ENDED, S.DETECTED), 13.0)
    assert [n.kind for n in c.due(15.0)] == [NoticeKind.ENDED]
    assert c.firing() == []
    assert c.due(13.0 + 86_400.0) == [] and c.known() == 0  # both forgotten in time


def test_opening_is_announced_before_the_recovery_when_they_come_apart() -> None:
    c = Coalescer(hold_s=1.0)
    c.offer(tr("i1", 0, S.DETECTED), 0.0)
    c.offer(tr("i1", 1, S.LOCATED, S.DETECTED, node="n7"), 0.5)
    [opened] = c.due(1.0)
    assert opened.kind == NoticeKind.OPENED and opened.state == S.LOCATED
    assert opened.node == "n7"
    c.offer(tr("i1", 2, S.MITIGATING, S.LOCATED, tier=1), 3.0)
    assert c.due(10.0) == []  # still open: nothing new to say
    c.offer(tr("i1", 3, S.RECOVERED, S.MITIGATING), 11.0)
    [recovered] = c.due(12.0)
    assert recovered.kind == NoticeKind.RECOVERED and recovered.tier == 1


def test_duplicates_and_stale_seqs_are_ignored() -> None:
    c = Coalescer(hold_s=0.0)
    c.offer(tr("i1", 0, S.DETECTED), 0.0)
    c.offer(tr("i1", 1, S.RECOVERED, S.DETECTED), 0.0)
    c.offer(tr("i1", 1, S.RECOVERED, S.DETECTED), 0.0)
    c.offer(tr("i1", 0, S.DETECTED), 0.0)  # redelivered after the recovery
    assert [n.kind for n in c.due(0.0)] == [NoticeKind.OPENED, NoticeKind.RECOVERED]
    assert c.stats.duplicates == 2


def test_escalation_then_recovery_and_reopening() -> None:
    c = Coalescer(hold_s=0.0)
    c.offer(tr("i1", 0, S.DETECTED), 0.0)
    c.offer(tr("i1", 1, S.ESCALATED, S.DETECTED), 0.0)
    assert [n.kind for n in c.due(0.0)] == [NoticeKind.OPENED, NoticeKind.ESCALATED]
    assert [(n.kind, n.refresh) for n in c.firing()] == [(NoticeKind.ESCALATED, True)]
    c.offer(tr("i1", 2, S.RECOVERED, S.ESCALATED), 1.0)
    assert [n.kind for n in c.due(1.0)] == [NoticeKind.RECOVERED]
    assert c.firing() == []
    c.offer(tr("i1", 3, S.DETECTED, S.RECOVERED), 2.0)
    assert [n.kind for n in c.due(2.0)] == [NoticeKind.REOPENED]


def test_a_transition_that_flaps_back_within_the_hold_says_nothing_new() -> None:
    c = Coalescer(hold_s=5.0)
    c.offer(tr("i1", 0, S.DETECTED), 0.0)
    assert len(c.due(5.0)) == 1
    c.offer(tr("i1", 1, S.RECOVERED, S.DETECTED), 6.0)
    c.offer(tr("i1", 2, S.DETECTED, S.RECOVERED), 7.0)  # back to open before announced
    assert c.due(20.0) == []
    assert not c.pending()


def test_an_incident_first_seen_mid_way_is_taken_as_already_opened() -> None:
    """After a restart from a committed offset: no second opening."""
    c = Coalescer(hold_s=0.0)
    c.offer(tr("i1", 3, S.RECOVERED, S.MITIGATING), 0.0)
    assert [n.kind for n in c.due(0.0)] == [NoticeKind.RECOVERED]


def test_closed_incidents_are_forgotten_after_retention_open_ones_never() -> None:
    c = Coalescer(hold_s=0.0, retain_s=10.0)
    c.offer(tr("closed", 0, S.DETECTED), 0.0)
    c.offer(tr("closed", 1, S.RECOVERED, S.DETECTED), 0.0)
    c.offer(tr("open", 0, S.DETECTED), 0.0)
    c.due(0.0)
    assert c.known() == 2
    c.due(10.0)
    assert c.known() == 1
    assert [n.incident_id for n in c.firing()] == ["open"]


def test_plan_covers_every_phase_change() -> None:
    for a in Phase:
        for d in Phase:
            if d == Phase.NONE:
                continue
            kinds = plan(a, d)
            # ended by the scheduler before it was told: nothing is, ever
            silent = a == d or (a, d) == (Phase.NONE, Phase.ENDED)
            assert (kinds == ()) == silent
            if a == Phase.NONE and not silent:
                assert kinds[0] == NoticeKind.OPENED


def test_a_storm_of_hundreds_of_incidents_is_a_handful_of_messages() -> None:
    c = Coalescer(hold_s=2.0)
    for i in range(300):
        for t in lifecycle(f"inc-{i:03d}"):
            c.offer(t, now=i * 0.01)  # 1500 transitions in 3 s
    messages = []
    for tick in range(0, 80):
        messages += group(c.due(tick * 0.25), max_individual=5)
    assert len(messages) <= 25  # one digest per quarter-second flush at most
    kinds = Counter(n.kind for m in messages for n in m.notices)
    assert kinds == {NoticeKind.OPENED: 300, NoticeKind.RECOVERED: 300}


STATES = list(S)


@st.composite
def streams(draw: st.DrawFn) -> list[tuple[float, Transition]]:
    n_inc = draw(st.integers(1, 6))
    out: list[tuple[float, Transition]] = []
    now = 0.0
    seqs = dict.fromkeys(range(n_inc), 0)
    prev: dict[int, S | None] = dict.fromkeys(range(n_inc))
    for _ in range(draw(st.integers(1, 60))):
        i = draw(st.integers(0, n_inc - 1))
        state = draw(st.sampled_from(STATES))
        now += draw(st.sampled_from([0.0, 0.0, 0.1, 0.5, 3.0]))
        seq = seqs[i] if draw(st.integers(0, 9)) == 0 else seqs[i] + 1  # some duplicates
        seqs[i] = seq
        out.append((now, tr(f"i{i}", seq, state, prev[i])))
        prev[i] = state
    return out


@settings(max_examples=200, deadline=None)
@given(streams(), st.sampled_from([0.0, 0.5, 2.0]))
def test_every_incident_opens_once_and_ends_where_its_latest_transition_is(
        stream: list[tuple[float, Transition]], hold: float) -> None:
    c = Coalescer(hold_s=hold)
    notices = []
    for now, t in stream:
        c.offer(t, now)
        notices += c.due(now)
    notices += c.due(stream[-1][0] + hold)
    assert not c.pending()
    by_inc: dict[str, list[NoticeKind]] = {}
    for n in notices:
        by_inc.setdefault(n.incident_id, []).append(n.kind)
    latest: dict[str, Transition] = {}
    for _now, t in stream:
        if t.incident_id not in latest or t.seq > latest[t.incident_id].seq:
            latest[t.incident_id] = t
    for inc, kinds in by_inc.items():
        assert kinds.count(NoticeKind.OPENED) == 1 and kinds[0] == NoticeKind.OPENED
        assert all(a != b for a, b in itertools.pairwise(kinds))  # no repeats
        final = latest[inc].to_state
        closing = {S.RECOVERED: NoticeKind.RECOVERED, S.ESCALATED: NoticeKind.ESCALATED,
                   S.UNRECOVERABLE: NoticeKind.UNRECOVERABLE, S.ENDED: NoticeKind.ENDED}.get(final)
        if closing is None:
            assert kinds[-1] in (NoticeKind.OPENED, NoticeKind.REOPENED)
        else:
            assert kinds[-1] == closing
    # everything offered is announced at least as opened (but an incident the scheduler
    # ended before its hold was over: never told), and no more notices than transitions
    assert set(by_inc) <= set(latest)
    for inc in set(latest) - set(by_inc):
        assert latest[inc].to_state is S.ENDED
    assert len(notices) <= len(stream) + len(latest)
