"""The remediation policy, pure: ladder, failures, spares, storms, deterministic keys."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.actuators import policy
from trainguard.actuators.policy import Decision, PolicyConfig, PolicyState
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    CommandAction,
    CommandOutcome,
    OutcomeStatus,
    PoolUnit,
    Severity,
    UnitState,
    Verdict,
    VerdictState,
)

JOB = "job-a"
S = 1_000_000
CFG = PolicyConfig(window_s=5, tier_windows=2, settle_s=1, quota_pct=400, storm_restarts=3,
                   storm_window_s=600, outcome_timeout_s=120)


def verdict(kind: str, rank: int | None, t: int, state: VerdictState = VerdictState.OPEN,
            pid: int | None = None, vid: str | None = None, node: str = "n1") -> Event:
    vid = vid or derived_id("v", kind, rank, t)
    ev: dict[str, str | int | float | bool | None] = {"pid": pid} if pid else {}
    return make_event(Verdict(verdict_id=vid, rule=kind, kind=kind, state=state,
                              severity=Severity.CRITICAL, first_anomalous_time=t,
                              decided_time=t, evidence=ev),
                      event_id=derived_id("e", vid, state.value), job_id=JOB, event_time=t,
                      source="test", subject=Subject(rank=rank, node=node))


def unit(name: str, state: UnitState, rank: int | None = None, pid: int | None = None,
         epoch: int | None = None) -> Event:
    return make_event(PoolUnit(unit=name, state=state, node="n1", rank=rank, pid=pid,
                               epoch=epoch),
                      event_id=derived_id("u", name, state.value, rank, pid), job_id=JOB,
                      event_time=1, source="test", subject=Subject(unit=name))


def outcome(d: Decision, status: OutcomeStatus, t: int, detail: str = "") -> Event:
    c = d.command
    return make_event(CommandOutcome(command_id=c.command_id, idempotency_key=c.idempotency_key,
                                     action=c.action, status=status, finished_at=t,
                                     detail=detail),
                      event_id=derived_id("o", c.idempotency_key, status.value), job_id=JOB,
                      event_time=t, source="test")


def ckpt(step: int, t: int) -> Event:
    return make_event(CheckpointEvent(action=CheckpointAction.WRITTEN, step=step,
                                      samples_consumed=step * 8, path=f"/c/{step}"),
                      event_id=derived_id("c", step, t), job_id=JOB, event_time=t,
                      source="test")


def pool(spares: int = 1) -> PolicyState:
    s = PolicyState()
    for r in range(4):
        s, _ = policy.step(s, unit(f"u{r}", UnitState.BOUND, r, 100 + r, 1), 0, CFG)
    for i in range(spares):
        s, _ = policy.step(s, unit(f"spare{i}", UnitState.SPARE), 0, CFG)
    return s


def feed(s: PolicyState, events: list[Event], now: int) -> tuple[PolicyState, list[Decision]]:
    out: list[Decision] = []
    for e in events:
        s, d = policy.step(s, e, now, CFG)
        out += d
    s, d = policy.tick(s, now, CFG)
    return s, out + d


def settled(s: PolicyState, events: list[Event],
            now: int) -> tuple[PolicyState, list[Decision]]:
    """Feed at ``now``, then tick once the settle time is over."""
    s, first = feed(s, events, now)
    s, later = feed(s, [], now + int(CFG.settle_s * S))
    return s, first + later


def test_straggler_climbs_the_ladder_one_tier_at_a_time() -> None:
    s, out = feed(pool(), [verdict("straggler", 2, 10 * S)], 10 * S)
    assert [(d.command.action, d.command.tier) for d in out] == [(CommandAction.RAISE_QUOTA, 1)]
    q = out[0]
    assert q.command.params["rank"] == 2 and q.command.params["unit"] == "u2"
    assert q.command.params["quota_pct"] == 400
    # the next tier waits for tier 1 to be done, then M windows
    s, out = feed(s, [], 60 * S)
    assert out == []
    s, out = feed(s, [outcome(q, OutcomeStatus.DONE, 61 * S)], 61 * S)
    s, out = feed(s, [], 61 * S + 9 * S)
    assert out == []  # 2 windows of 5 s not yet over
    s, out = feed(s, [], 71 * S)
    assert [(d.command.action, d.command.tier) for d in out] == [(CommandAction.MIGRATE, 2)]
    m = out[0]
    assert m.command.params["from_unit"] == "u2"
    s, out = feed(s, [outcome(m, OutcomeStatus.DONE, 80 * S)], 90 * S)
    assert [(d.command.action, d.command.tier) for d in out] == [(CommandAction.RESUME, 3)]
    s, out = feed(s, [outcome(out[0], OutcomeStatus.DONE, 91 * S)], 101 * S)
    assert [d.command.action for d in out] == [CommandAction.ESCALATE]
    assert "still slow after tiers 1-3" in str(out[0].command.params["reason"])


def test_a_resolved_straggler_stops_the_ladder() -> None:
    v = verdict("straggler", 1, 10 * S)
    s, out = feed(pool(), [v], 10 * S)
    s, _ = feed(s, [outcome(out[0], OutcomeStatus.DONE, 11 * S)], 11 * S)
    assert v.payload.verdict_id  # type: ignore[attr-defined]
    resolved = verdict("straggler", 1, 10 * S, VerdictState.RESOLVED,
                       vid=v.payload.verdict_id)  # type: ignore[attr-defined]
    s, out = feed(s, [resolved], 15 * S)
    s, out2 = feed(s, [], 100 * S)
    assert out == [] and out2 == [] and s.ladders == {}


def test_failures_settle_and_only_the_earliest_is_the_cause() -> None:
    killed = verdict("process_exit", 3, 10 * S, pid=103)
    survivors = [verdict("process_exit", r, 10 * S + 200_000 + r, pid=100 + r) for r in range(3)]
    s, out = feed(pool(), [survivors[0], killed], 10 * S + 300_000)
    assert out == []  # settling
    s, out = feed(s, survivors[1:], 11 * S + 400_000)
    assert len(out) == 1
    cmd = out[0].command
    assert (cmd.action, cmd.params["rank"], cmd.params["resume"]) == (CommandAction.MIGRATE, 3,
                                                                       True)
    assert cmd.cause_verdict_ids == [killed.payload.verdict_id]  # type: ignore[attr-defined]
    assert len(cmd.params["covered_verdicts"]) == 3  # type: ignore[arg-type]
    # exits of the fenced replicas while the restart is under way are covered, not acted on
    s, out = feed(s, [verdict("process_exit", 1, 12 * S, pid=101)], 20 * S)
    assert out == []


def test_a_verdict_about_a_replaced_pid_is_ignored() -> None:
    s = pool()
    s, _ = policy.step(s, unit("spare0", UnitState.BOUND, 3, 555, 2), 0, CFG)
    s, out = feed(s, [verdict("process_exit", 3, 10 * S, pid=103)], 20 * S)
    assert out == []


def test_no_spare_escalates_and_never_shrinks() -> None:
    _, out = settled(pool(spares=0), [verdict("process_exit", 3, 10 * S, pid=103)], 12 * S)
    assert [d.command.action for d in out] == [CommandAction.ESCALATE]
    reason = str(out[0].command.params["reason"])
    assert "no spare unit" in reason and "not shrunk" in reason


def test_failed_command_escalates_with_its_detail() -> None:
    s, out = settled(pool(), [verdict("rank_silent", 0, 10 * S)], 12 * S)
    s, out = feed(s, [outcome(out[0], OutcomeStatus.FAILED, 13 * S, "no spare can reach")],
                  13 * S)
    assert [d.command.action for d in out] == [CommandAction.ESCALATE]
    assert "failed: no spare can reach" in str(out[0].command.params["reason"])


def test_missing_outcome_times_out_into_an_escalation() -> None:
    s, out = feed(pool(), [verdict("straggler", 0, 10 * S)], 10 * S)
    s, out = feed(s, [], 10 * S + 121 * S)
    assert [d.command.action for d in out] == [CommandAction.ESCALATE]
    assert "no final outcome" in str(out[0].command.params["reason"])


def test_restart_storm_without_checkpoint_progress_stops_and_escalates() -> None:
    s = pool(spares=5)
    s, _ = feed(s, [ckpt(40, 1 * S)], 1 * S)
    t = 10 * S
    for i in range(3):
        s, out = settled(s, [verdict("process_exit", 0, t, pid=None)], t + 2 * S)
        assert [d.command.action for d in out] == [CommandAction.MIGRATE], i
        s, out = feed(s, [outcome(out[0], OutcomeStatus.DONE, t + 3 * S)], t + 3 * S)
        t += 30 * S
    assert [d.command.action for d in out] == [CommandAction.ESCALATE]
    assert "restart storm" in str(out[0].command.params["reason"])
    s, out = settled(s, [verdict("process_exit", 1, t)], t + 5 * S)
    assert out == [] and "restart storm" in s.stopped[JOB]


def test_checkpoint_progress_between_restarts_is_no_storm() -> None:
    s = pool(spares=5)
    t = 10 * S
    for i in range(4):
        s, _ = feed(s, [ckpt(40 + 10 * i, t)], t)
        s, out = settled(s, [verdict("process_exit", 0, t, pid=None)], t + 2 * S)
        assert [d.command.action for d in out] == [CommandAction.MIGRATE]
        s, out = feed(s, [outcome(out[0], OutcomeStatus.DONE, t + 3 * S)], t + 3 * S)
        assert out == []
        t += 30 * S


@given(st.lists(st.tuples(st.sampled_from(["straggler", "process_exit", "rank_silent"]),
                          st.integers(0, 3), st.integers(1, 50)), min_size=1, max_size=8),
       st.integers(0, 3))
@settings(max_examples=100, deadline=None)
def test_keys_are_deterministic_and_never_repeat(items: list[tuple[str, int, int]],
                                                 spares: int) -> None:
    events = sorted((verdict(k, r, t * S) for k, r, t in items),
                    key=lambda e: e.event_time)

    def run() -> list[Decision]:
        s = pool(spares)
        out: list[Decision] = []
        now = 0
        for e in events:
            now = max(now, e.event_time)
            s, d = feed(s, [e], now)
            out += d
        s, d = feed(s, [], now + 200 * S)
        return out + d

    first, second = run(), run()
    keys = [d.command.idempotency_key for d in first]
    assert keys == [d.command.idempotency_key for d in second]
    assert len(keys) == len(set(keys))
    if spares == 0:
        assert CommandAction.MIGRATE not in {d.command.action for d in first}
