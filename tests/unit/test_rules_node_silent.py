"""Node silence (``liveness``'s ``node_silent``): a node whose agent and ranks all went silent
gives one verdict located at the node, not one ``rank_silent`` per rank; the policy moves every
rank bound there."""

from __future__ import annotations

import random

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.rules_support import RULES, T0, S, kinds, run
from trainguard.actuators import policy
from trainguard.actuators.policy import PolicyConfig, PolicyState
from trainguard.events.codec import encode, make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    CommandAction,
    MigrateParams,
    PoolUnit,
    UnitState,
    Verdict,
    VerdictKind,
    VerdictState,
)
from trainguard.rules import RuleEngine
from trainguard.rules.synth import bound, step_report, telemetry

pytestmark = pytest.mark.unit

NODES = 3
PER = 2  # ranks per node: rank r is on node n{r // PER}


def cluster(end_s: int, *, lost: int | None = None, lost_from: int = 20,
            back_at: int | None = None, ranks_back: bool = True,
            agent_lost: bool = True, ranks_lost: tuple[int, ...] | None = None) -> list[Event]:
    """Every node's agent sends telemetry each second, every rank a step report each second.
    Node ``lost`` (its agent if ``agent_lost``, and its ranks, or only ``ranks_lost``) is
    silent from ``lost_from`` until ``back_at`` (the ranks too unless ``ranks_back`` is
    false)."""
    events: list[Event] = []
    for sec in range(end_s):
        for n in range(NODES):
            node = f"n{n}"
            gone = n == lost and sec >= lost_from
            agent_back = back_at is not None and sec >= back_at
            if not (gone and agent_lost and not agent_back):
                events.append(telemetry("j", node, T0 + sec * S + 500_000 + n, sec))
            for r in range(n * PER, (n + 1) * PER):
                silent = gone and (ranks_lost is None or r in ranks_lost) and not (
                    agent_back and ranks_back)
                if not silent:
                    events.append(step_report("j", r, sec, T0 + sec * S + r * 10, 100.0,
                                              world=NODES * PER, node=node))
    return events


def liveness(out: list[Event]) -> list[tuple[str, str, str | None, int | None]]:
    return [(v.payload.kind.value, v.payload.state.value, v.subject.node, v.subject.rank)
            for v in out if isinstance(v.payload, Verdict)
            and v.payload.kind in (VerdictKind.NODE_SILENT, VerdictKind.RANK_SILENT)]


def evidence(ev: Event) -> dict[str, object]:
    assert isinstance(ev.payload, Verdict)
    return dict(ev.payload.evidence)


def test_a_lost_node_gives_one_verdict_at_the_node_resolved_when_heard_again() -> None:
    out = run(cluster(120, lost=1, lost_from=20, back_at=100))
    assert kinds(out) == [("node_silent", "open"), ("node_silent", "resolved")]
    opened, resolved = out
    assert (opened.subject.node, opened.subject.rank) == ("n1", None)
    v = opened.payload
    assert isinstance(v, Verdict)
    # its last sign of life: the agent's record of second 19 (after its ranks' reports)
    assert v.first_anomalous_time == T0 + 19 * S + 500_000 + 1
    # 10 intervals of 1 s (= the 10 s floor), checked every second of event time
    assert 10 * S < opened.event_time - v.first_anomalous_time <= 11 * S + 1
    ev = v.evidence
    assert ev["ranks"] == [2, 3]
    assert ev["rank_last_times"] == [T0 + 19 * S + 20, T0 + 19 * S + 30]
    assert ev["agent_last_time"] == v.first_anomalous_time
    assert (ev["agent_last_record"], ev["agent_interval_ms"], ev["timeout_ms"]) == (
        "telemetry.node", 1000.0, 10000.0)
    assert ev["ranks_last_step"] == 19
    rv = resolved.payload
    assert isinstance(rv, Verdict) and rv.verdict_id == v.verdict_id
    assert resolved.event_time == T0 + 100 * S + 20  # rank 2's report from n1, the first
    assert rv.evidence["heard"] == "step.report"


def test_ranks_still_silent_when_the_agent_is_back_are_left_to_rank_silent() -> None:
    # the node verdict stands for its ranks only while the node is silent: the agent heard
    # again (a restarted agent, its ranks dead) hands them to rank_silent
    out = run(cluster(160, lost=1, lost_from=20, back_at=100, ranks_back=False))
    assert liveness(out) == [("node_silent", "open", "n1", None),
                             ("node_silent", "resolved", "n1", None),
                             ("rank_silent", "open", "n1", 2), ("rank_silent", "open", "n1", 3)]
    back = [e for e in out if isinstance(e.payload, Verdict)]
    assert evidence(back[1])["heard"] == "telemetry.node"
    # silent 80 s > the 60 s floor: opened at the first check after the node was heard
    assert back[2].event_time - back[1].event_time <= 1 * S + 10


def test_one_rank_silent_on_a_live_node_is_rank_silent_only() -> None:
    out = run(cluster(120, lost=1, lost_from=20, agent_lost=False, ranks_lost=(3,)))
    assert liveness(out) == [("rank_silent", "open", "n1", 3)]


def test_every_rank_of_a_node_silent_while_its_agent_reports_is_no_node_loss() -> None:
    out = run(cluster(120, lost=1, lost_from=20, agent_lost=False))
    assert liveness(out) == [("rank_silent", "open", "n1", 2), ("rank_silent", "open", "n1", 3)]


def test_an_agent_silent_while_its_ranks_report_is_no_node_loss() -> None:
    out = run(cluster(120, lost=1, lost_from=20, ranks_lost=()))
    assert liveness(out) == []


def test_a_node_whose_ranks_all_exited_or_that_holds_none_is_not_judged() -> None:
    # agents only (no rank anywhere), one of them stops: no verdict of the job's
    events = [telemetry("j", f"n{n}", T0 + sec * S + n, sec) for sec in range(60)
              for n in range(NODES) if not (n == 1 and sec >= 20)]
    assert kinds(run(events)) == []


def test_the_job_leaving_the_node_resolves_it() -> None:
    # node n1 lost for good; the actuator binds ranks 2 and 3 anew (epoch 1) and they report
    # from the spare n3: the verdict resolves at the second binding, and no rank_silent opens
    events = cluster(90, lost=1, lost_from=20)
    events += [bound("j", 2, 1, T0 + 40 * S), bound("j", 3, 1, T0 + 41 * S)]
    events += [step_report("j", r, sec, T0 + sec * S + r * 10, 100.0, world=6, node="n3",
                           epoch=1) for sec in range(45, 90) for r in (2, 3)]
    out = run(events)
    assert liveness(out) == [("node_silent", "open", "n1", None),
                             ("node_silent", "resolved", "n1", None)]
    resolved = out[1]
    assert resolved.event_time == T0 + 41 * S
    assert evidence(resolved) == {"left": True}


# --- replay and arrival order -------------------------------------------------------------


def test_replay_reproduces_the_same_bytes() -> None:
    events = cluster(120, lost=1, lost_from=20, back_at=100)
    first = [encode(e) for e in run(events)]
    assert first and first == [encode(e) for e in run(list(reversed(events)))]


@settings(max_examples=25, deadline=None)
@given(lost=st.integers(0, NODES - 1), lost_from=st.integers(5, 40),
       back=st.one_of(st.none(), st.integers(60, 90)), seed=st.integers(0, 2**32 - 1),
       cut=st.floats(0.0, 1.0))
def test_any_arrival_within_the_lateness_and_a_restart_decide_the_same(
        lost: int, lost_from: int, back: int | None, seed: int, cut: float) -> None:
    events = cluster(100, lost=lost, lost_from=lost_from, back_at=back)
    reference = run(events)
    node = f"n{lost}"
    expected = [("node_silent", "open", node, None)]
    if back is not None:
        expected.append(("node_silent", "resolved", node, None))
    assert liveness(reference) == expected
    # each event arrives up to 1.9 s after its event time (the lateness bound is 2 s), and
    # the worker restarts from a snapshot somewhere in between
    rng = random.Random(seed)
    arrivals = sorted(events, key=lambda e: (e.event_time + rng.randrange(1_900_000),
                                             e.event_id))
    engine = RuleEngine("j", RULES)
    out: list[Event] = []
    at = int(cut * len(arrivals))
    for ev in arrivals[:at]:
        out += engine.feed(ev)
    engine = RuleEngine("j", RULES, orjson.loads(orjson.dumps(engine.snapshot())))
    for ev in arrivals[at:]:
        out += engine.feed(ev)
    out += engine.flush()
    assert engine.late == 0
    assert [encode(e) for e in out] == [encode(e) for e in reference]


def test_a_snapshot_from_before_node_silent_restores_and_decides() -> None:
    """A worker upgraded over a snapshot whose liveness state lacks the node keys (the layout
    before node_silent) carries on: no KeyError on the next record, and node loss after the
    restart is still decided."""
    events = cluster(100, lost=1, lost_from=40, back_at=None)
    engine = RuleEngine("j", RULES)
    half = [e for e in events if e.event_time < T0 + 20 * S]
    for ev in half:
        engine.feed(ev)
    snap = orjson.loads(orjson.dumps(engine.snapshot()))
    state = snap["rules"]["liveness"]["state"]["state"]
    for key in ("step", "agent"):
        del state[key]
    engine = RuleEngine("j", RULES, snap)
    out: list[Event] = []
    for ev in events[len(half):]:
        out += engine.feed(ev)
    out += engine.flush()
    assert ("node_silent", "open", "n1", None) in liveness(out)


# --- the policy: tier 2, every rank of the node ----------------------------------------


def placed(name: str, node: str, rank: int | None) -> Event:
    state = UnitState.SPARE if rank is None else UnitState.BOUND
    return make_event(PoolUnit(unit=name, state=state, node=node, rank=rank,
                               pid=None if rank is None else 100 + rank,
                               epoch=None if rank is None else 1),
                      event_id=derived_id("u", name, state.value, rank), job_id="j",
                      event_time=1, source="test", subject=Subject(unit=name))


def test_the_policy_migrates_every_rank_of_the_silent_node_at_tier_2() -> None:
    cfg = PolicyConfig(settle_s=1)
    s = PolicyState()
    for r in range(NODES * PER):
        s, _ = policy.step(s, placed(f"u{r}", f"n{r // PER}", r), 0, cfg)
    for i in range(2):
        s, _ = policy.step(s, placed(f"spare{i}", "n3", None), 0, cfg)
    opened = run(cluster(60, lost=1, lost_from=20))
    assert kinds(opened) == [("node_silent", "open")]
    now = opened[0].event_time
    s, first = policy.step(s, opened[0], now, cfg)
    s, later = policy.tick(s, now + 1 * S, cfg)
    decisions = first + later
    assert [d.command.action for d in decisions] == [CommandAction.MIGRATE]
    cmd = decisions[0].command
    params = cmd.params
    assert isinstance(params, MigrateParams)
    assert cmd.tier == 2
    assert (params.rank, params.ranks, params.from_units) == (2, [2, 3], ["u2", "u3"])
    assert params.resume and params.avoid_domains == ["node=n1"]
    verdict = opened[0].payload
    assert isinstance(verdict, Verdict) and verdict.state is VerdictState.OPEN
    assert cmd.cause_verdict_ids == [verdict.verdict_id]
