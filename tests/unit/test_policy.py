"""The remediation policy, pure: ladder, failures, spares, storms, deterministic keys."""

from __future__ import annotations

import itertools

import pytest
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
    JobEnded,
    MigrateParams,
    OutcomeStatus,
    PoolUnit,
    RaiseQuotaParams,
    RetryCondition,
    SchedulerEnd,
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
            pid: int | None = None, vid: str | None = None, node: str | None = "n1",
            exit_code: int | None = None, sig: int | None = None,
            gpu: int | None = None, epoch: int | None = None,
            said: tuple[int, str] | None = None) -> Event:
    """``said``: what the rank declared before it ended (code, cause)."""
    vid = vid or derived_id("v", kind, rank, t, node)
    ev: dict[str, str | int | float | bool | None] = {"pid": pid} if pid else {}
    if kind == "process_exit":
        ev.update({"exit_code": exit_code, "signal": sig, "binding_epoch": epoch})
        if said is not None:
            ev.update({"declared_code": said[0], "declared_cause": said[1]})
    return make_event(Verdict(verdict_id=vid, rule=kind, kind=kind, state=state,
                              severity=Severity.CRITICAL, first_anomalous_time=t,
                              decided_time=t, evidence=ev),
                      event_id=derived_id("e", vid, state.value), job_id=JOB, event_time=t,
                      source="test", subject=Subject(rank=rank, node=node, gpu=gpu))


def unit(name: str, state: UnitState, rank: int | None = None, pid: int | None = None,
         epoch: int | None = None, quota: bool = True) -> Event:
    return make_event(PoolUnit(unit=name, state=state, node="n1", rank=rank, pid=pid,
                               epoch=epoch, quota=quota),
                      event_id=derived_id("u", name, state.value, rank, pid), job_id=JOB,
                      event_time=1, source="test", subject=Subject(unit=name))


def outcome(d: Decision, status: OutcomeStatus, t: int, detail: str = "",
            retry: RetryCondition | None = None) -> Event:
    c = d.command
    return make_event(CommandOutcome(command_id=c.command_id, idempotency_key=c.idempotency_key,
                                     action=c.action, status=status, finished_at=t,
                                     detail=detail,
                                     data={"retry": retry} if retry else {}),
                      event_id=derived_id("o", c.idempotency_key, status.value), job_id=JOB,
                      event_time=t, source="test")


def migrate(d: Decision) -> MigrateParams:
    assert isinstance(d.command.params, MigrateParams), d.command.action
    return d.command.params


def ckpt(step: int, t: int) -> Event:
    return make_event(CheckpointEvent(action=CheckpointAction.WRITTEN, step=step,
                                      samples_consumed=step * 8, path=f"/c/{step}"),
                      event_id=derived_id("c", step, t), job_id=JOB, event_time=t,
                      source="test")


def loaded(step: int, t: int) -> Event:
    return make_event(CheckpointEvent(action=CheckpointAction.LOADED, step=step,
                                      samples_consumed=step * 8, path=f"/c/{step}"),
                      event_id=derived_id("l", step, t), job_id=JOB, event_time=t,
                      source="test", subject=Subject(rank=0))


def test_a_restart_that_never_loads_a_checkpoint_moves_on_after_the_outcome_timeout() -> None:
    s, (save,) = _to_tier_two()
    s, out = feed(s, [outcome(save, OutcomeStatus.FAILED, 22 * S, "no handler")], 22 * S)
    s, out = feed(s, [outcome(out[0], OutcomeStatus.DONE, 30 * S)], 30 * S)
    s, out = feed(s, [], 30 * S + int(CFG.outcome_timeout_s * S) - 1)
    assert out == []
    s, out = feed(s, [], 30 * S + int(CFG.outcome_timeout_s * S))
    assert [(d.command.action, d.command.tier) for d in out] == [(CommandAction.RESUME, 3)]


def pool(spares: int = 1, quota: bool = True) -> PolicyState:
    s = PolicyState()
    for r in range(4):
        s, _ = policy.step(s, unit(f"u{r}", UnitState.BOUND, r, 100 + r, 1, quota), 0, CFG)
    for i in range(spares):
        s, _ = policy.step(s, unit(f"spare{i}", UnitState.SPARE, quota=quota), 0, CFG)
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
    """Feed at ``now``, then tick once the settle time is over (the longer one, of exits that
    nobody accounted for, included)."""
    s, first = feed(s, events, now)
    s, later = feed(s, [], now + int(max(CFG.settle_s, CFG.scheduler_settle_s) * S))
    return s, first + later


def test_straggler_climbs_the_ladder_one_tier_at_a_time() -> None:
    s, out = feed(pool(), [verdict("straggler", 2, 10 * S)], 10 * S)
    assert [(d.command.action, d.command.tier) for d in out] == [(CommandAction.RAISE_QUOTA, 1)]
    q = out[0]
    qp = q.command.params
    assert isinstance(qp, RaiseQuotaParams)
    assert qp.rank == 2 and qp.unit == "u2" and qp.quota_pct == 400
    # the next tier waits for tier 1 to be done, then M windows
    s, out = feed(s, [], 60 * S)
    assert out == []
    s, out = feed(s, [outcome(q, OutcomeStatus.DONE, 61 * S)], 61 * S)
    s, out = feed(s, [], 61 * S + 9 * S)
    assert out == []  # 2 windows of 5 s not yet over
    s, out = feed(s, [], 71 * S)  # tier 2 saves first: fewer steps redone after the restart
    assert [(d.command.action, d.command.tier) for d in out] == [
        (CommandAction.CHECKPOINT_NOW, 2)]
    assert out[0].command.params.rank == 2
    s, out = feed(s, [outcome(out[0], OutcomeStatus.DONE, 72 * S)], 72 * S)
    assert out == []  # asked: now the checkpoint itself
    s, out = feed(s, [ckpt(50, 74 * S)], 74 * S)
    assert [(d.command.action, d.command.tier) for d in out] == [(CommandAction.MIGRATE, 2)]
    m = out[0]
    assert migrate(m).from_unit == "u2"
    s, out = feed(s, [outcome(m, OutcomeStatus.DONE, 80 * S)], 90 * S)
    assert out == []  # the restarted job has not loaded its checkpoint: no evidence yet
    s, out = feed(s, [loaded(50, 85 * S)], 85 * S)
    s, out = feed(s, [], 94 * S)
    assert out == []  # M windows from the load, not from the command's end
    s, out = feed(s, [], 95 * S)
    assert [(d.command.action, d.command.tier) for d in out] == [(CommandAction.RESUME, 3)]
    s, out = feed(s, [outcome(out[0], OutcomeStatus.DONE, 96 * S), loaded(50, 96 * S)], 96 * S)
    s, out = feed(s, [], 106 * S)
    assert [d.command.action for d in out] == [CommandAction.ESCALATE]
    assert "still slow after tiers 1-3" in out[0].command.params.reason


def test_without_a_quota_tier_1_is_a_wait_with_no_command_then_tier_2() -> None:
    """A unit whose backend sets no CPU quota (Slurm): no raise_quota to be refused (and
    escalated); the verdict gets tier 1's windows to clear by itself, then tier 2 as usual."""
    s, out = feed(pool(quota=False), [ckpt(40, 1 * S), verdict("straggler", 2, 10 * S)],
                  10 * S)
    assert out == [] and s.ladders["job-a/2"].tier == 1
    s, out = feed(s, [], 10 * S + int(CFG.window_s * CFG.tier_windows * S) - 1)
    assert out == []
    s, out = feed(s, [], 10 * S + int(CFG.window_s * CFG.tier_windows * S))
    assert [(d.command.action, d.command.tier) for d in out] == [
        (CommandAction.CHECKPOINT_NOW, 2)]
    s, out = feed(s, [ckpt(50, 21 * S)], 21 * S)
    assert [(d.command.action, d.command.tier) for d in out] == [(CommandAction.MIGRATE, 2)]
    assert migrate(out[0]).from_unit == "u2"


def test_without_a_quota_a_passing_straggler_verdict_moves_nothing() -> None:
    v = verdict("straggler", 2, 10 * S)
    s, out = feed(pool(quota=False), [v], 10 * S)
    resolved = verdict("straggler", 2, 10 * S, VerdictState.RESOLVED,
                       vid=v.payload.verdict_id)  # type: ignore[attr-defined]
    s, out2 = feed(s, [resolved], 14 * S)
    s, out3 = feed(s, [], 300 * S)
    assert out == out2 == out3 == [] and s.ladders == {} and s.pending == {}


def _to_tier_two(cfg: PolicyConfig = CFG) -> tuple[PolicyState, list[Decision]]:
    s, out = feed(pool(), [ckpt(40, 1 * S), verdict("straggler", 2, 10 * S, vid="v-slow")],
                  10 * S)
    s, _ = feed(s, [outcome(out[0], OutcomeStatus.DONE, 11 * S)], 11 * S)
    return policy.tick(s, 21 * S, cfg)  # M windows after tier 1


def test_a_straggler_migrates_without_its_save_when_the_save_fails_or_takes_too_long() -> None:
    s, (save,) = _to_tier_two()
    assert save.command.action is CommandAction.CHECKPOINT_NOW
    _, out = feed(s, [outcome(save, OutcomeStatus.FAILED, 22 * S, "no SIGUSR1 handler")], 22 * S)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]  # no escalation
    s, out = feed(s, [outcome(save, OutcomeStatus.DONE, 22 * S)], 22 * S)
    s, out = feed(s, [], 21 * S + int(CFG.checkpoint_wait_s * S) - 1)
    assert out == []  # still waiting for the checkpoint
    s, out = feed(s, [], 21 * S + int(CFG.checkpoint_wait_s * S))
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]
    s, _ = feed(s, [outcome(out[0], OutcomeStatus.DONE, 52 * S)], 52 * S)
    s, out = feed(s, [], 54 * S + int(CFG.outcome_timeout_s * S))
    assert CommandAction.ESCALATE not in [d.command.action for d in out]  # nothing pending
    # an old checkpoint (not newer than when it asked) does not count as the save
    s, (save,) = _to_tier_two()
    s, out = feed(s, [outcome(save, OutcomeStatus.DONE, 22 * S), ckpt(40, 23 * S)], 23 * S)
    assert out == []


def test_a_straggler_resolved_while_saving_is_not_migrated() -> None:
    s, (save,) = _to_tier_two()
    resolved = verdict("straggler", 2, 10 * S, VerdictState.RESOLVED, vid="v-slow")
    s, out = feed(s, [resolved], 22 * S)
    s, out2 = feed(s, [outcome(save, OutcomeStatus.FAILED, 23 * S, "no SIGUSR1 handler")],
                   23 * S)
    s, out3 = feed(s, [], 300 * S)
    assert out == out2 == out3 == [] and s.ladders == {}  # no migrate, no escalation


def test_no_save_before_migrating_when_its_wait_is_zero() -> None:
    cfg = PolicyConfig(window_s=5, tier_windows=2, settle_s=1, quota_pct=400,
                       checkpoint_wait_s=0)
    _, out = _to_tier_two(cfg)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]


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
    killed = verdict("process_exit", 3, 10 * S, pid=103, sig=9)
    # its synchronous peers leave with the peer-lost exit code: consequences, not failures
    survivors = [verdict("process_exit", r, 10 * S + 200_000 + r, pid=100 + r, exit_code=3)
                 for r in range(3)]
    s, out = feed(pool(), [survivors[0], killed], 10 * S + 300_000)
    assert out == []  # settling
    s, out = feed(s, survivors[1:], 11 * S + 400_000)
    assert len(out) == 1
    cmd = out[0].command
    mp = migrate(out[0])
    assert (cmd.action, mp.rank, mp.resume) == (CommandAction.MIGRATE, 3, True)
    assert cmd.cause_verdict_ids == [killed.payload.verdict_id]  # type: ignore[attr-defined]
    assert len(mp.covered_verdicts) == 3
    assert mp.ranks == [3] and mp.from_units == ["u3"]
    assert mp.avoid_domains == []  # one rank dying says nothing about its node
    # exits of the fenced replicas while the restart is under way are covered, not acted on
    s, out = feed(s, [verdict("process_exit", 1, 12 * S, pid=101)], 20 * S)
    assert out == []


def test_a_verdict_about_a_replaced_pid_is_ignored() -> None:
    s = pool()
    s, _ = policy.step(s, unit("spare0", UnitState.BOUND, 3, 555, 2), 0, CFG)
    _, stale = settled(s, [verdict("process_exit", 3, 10 * S, pid=103)], 12 * S)
    assert stale == []
    # the same verdict about the live replica is acted on: the pid is what decides
    _, live = settled(s, [verdict("process_exit", 3, 10 * S, pid=555)], 12 * S)
    assert [d.command.action for d in live] == [CommandAction.ESCALATE]


def test_the_binding_epoch_decides_staleness_where_the_verdict_has_one() -> None:
    # a Slurm unit's pid is its srun on the head; the exit is of the rank's own pid on the node
    s = pool()
    s, _ = policy.step(s, unit("spare0", UnitState.BOUND, 3, 555, 2), 0, CFG)
    _, live = settled(s, [verdict("process_exit", 3, 10 * S, pid=9103, epoch=2)], 12 * S)
    assert [d.command.action for d in live] == [CommandAction.ESCALATE]  # acted on
    _, old = settled(s, [verdict("process_exit", 3, 10 * S, pid=555, epoch=1)], 12 * S)
    assert old == []  # an older binding's exit, whatever its pid


def test_no_spare_escalates_and_never_shrinks() -> None:
    _, out = settled(pool(spares=0), [verdict("process_exit", 3, 10 * S, pid=103)], 12 * S)
    assert [d.command.action for d in out] == [CommandAction.ESCALATE]
    reason = out[0].command.params.reason
    assert "no spare unit" in reason and "not shrunk" in reason


def test_failed_command_escalates_with_its_detail() -> None:
    s, out = settled(pool(), [verdict("rank_silent", 0, 10 * S)], 12 * S)
    s, out = feed(s, [outcome(out[0], OutcomeStatus.FAILED, 13 * S, "no spare can reach")],
                  13 * S)
    assert [d.command.action for d in out] == [CommandAction.ESCALATE]
    assert "failed: no spare can reach" in out[0].command.params.reason


def _refused(s: PolicyState, d: Decision, t: int) -> tuple[PolicyState, list[Decision]]:
    return feed(s, [outcome(d, OutcomeStatus.FAILED, t, "migrate: no spare can reach the job's "
                            "storage", RetryCondition.STORAGE_UNREACHABLE)], t)


def test_a_restart_refused_for_unreachable_storage_is_retried_with_backoff() -> None:
    s, out = settled(pool(), [verdict("process_exit", 0, 10 * S, sig=9)], 12 * S)
    (first,) = out
    s, out = _refused(s, first, 13 * S)
    assert out == []  # no escalation: the storage may come back
    s, out = feed(s, [verdict("process_exit", 1, 14 * S, exit_code=3)], 14 * S)
    s, out2 = feed(s, [], 16 * S)
    assert out + out2 == []  # a peer's exit meanwhile is covered by the retry, not a new move
    s, out = feed(s, [], 13 * S + int(CFG.retry_backoff_s * S) - 1)
    assert out == []  # not before its backoff
    s, out = feed(s, [], 13 * S + int(CFG.retry_backoff_s * S))
    (again,) = out
    assert again.command.action is CommandAction.MIGRATE
    assert again.command.params == first.command.params
    assert again.command.idempotency_key != first.command.idempotency_key
    s, out = _refused(s, again, 20 * S)  # refused again: the wait doubles
    s, out = feed(s, [], 20 * S + int(2 * CFG.retry_backoff_s * S) - 1)
    assert out == []
    s, out = feed(s, [], 20 * S + int(2 * CFG.retry_backoff_s * S))
    (third,) = out
    s, out = feed(s, [ckpt(40, 31 * S), outcome(third, OutcomeStatus.DONE, 31 * S)], 31 * S)
    assert out == [] and s.retries == {} and s.pending == {}
    assert len(s.restarts[JOB]) == 1  # the refusals were no restarts


def test_a_retried_restart_escalates_once_its_budget_is_spent() -> None:
    cfg = CFG
    s, (d,) = settled(pool(), [verdict("process_exit", 0, 10 * S, sig=9)], 12 * S)
    t = 13 * S
    refusals = 0
    while True:
        s, out = _refused(s, d, t)
        refusals += 1
        if out:
            break
        assert refusals < 50
        t = s.retries[JOB].due_at
        s, (d,) = feed(s, [], t)
    assert [x.command.action for x in out] == [CommandAction.ESCALATE]
    assert t - 13 * S >= int(cfg.retry_budget_s * S)
    reason = out[0].command.params.reason
    assert f"refused {refusals} times" in reason and "storage" in reason
    assert s.retries == {}


def test_a_retry_is_dropped_when_its_verdict_resolves() -> None:
    v = verdict("process_exit", 0, 10 * S, sig=9, vid="v-exit")
    s, (d,) = settled(pool(), [v], 12 * S)
    s, _ = _refused(s, d, 13 * S)
    resolved = verdict("process_exit", 0, 14 * S, state=VerdictState.RESOLVED, vid="v-exit")
    s, out = feed(s, [resolved], 14 * S)
    s, out2 = feed(s, [], 60 * S)
    assert out + out2 == [] and s.retries == {}


def test_a_plain_failure_of_a_restart_still_escalates_at_once() -> None:
    s, (d,) = settled(pool(), [verdict("process_exit", 0, 10 * S, sig=9)], 12 * S)
    s, out = feed(s, [outcome(d, OutcomeStatus.FAILED, 13 * S, "fencing failed")], 13 * S)
    assert [x.command.action for x in out] == [CommandAction.ESCALATE]
    assert s.retries == {}


def test_missing_outcome_times_out_into_an_escalation() -> None:
    s, out = feed(pool(), [verdict("straggler", 0, 10 * S)], 10 * S)
    s, out = feed(s, [], 10 * S + 121 * S)
    assert [d.command.action for d in out] == [CommandAction.ESCALATE]
    assert "no final outcome" in out[0].command.params.reason


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
    assert "restart storm" in out[0].command.params.reason
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


# --- several ranks failing together (a node lost) -----------------------------------------


def placed(name: str, state: UnitState, node: str, rank: int | None = None,
           pid: int | None = None, labels: dict[str, str] | None = None) -> Event:
    return make_event(PoolUnit(unit=name, state=state, node=node, rank=rank, pid=pid,
                               epoch=1 if rank is not None else None, labels=labels or {}),
                      event_id=derived_id("u", name, state.value, rank, pid), job_id=JOB,
                      event_time=1, source="test", subject=Subject(unit=name))


def two_nodes(spares: dict[str, str], *, by_label: bool = False) -> PolicyState:
    """Ranks 0-1 on node a, 2-3 on node b; ``spares`` maps spare name -> its node. With
    ``by_label`` every unit is on one machine and the node is a label (as in the drills)."""
    s = PolicyState()
    layout: list[tuple[str, str, int | None]] = [(f"u{r}", "a" if r < 2 else "b", r)
                                                  for r in range(4)]
    layout += [(name, node, None) for name, node in spares.items()]
    for name, node, rank in layout:
        where = ("host", {"drill_node": node, "rack": "r1"}) if by_label else (node, {})
        s, _ = policy.step(s, placed(name, UnitState.BOUND if rank is not None
                                     else UnitState.SPARE, where[0], rank,
                                     100 + rank if rank is not None else None, where[1]),
                           0, CFG)
    return s


def node_b_lost(t: int) -> list[Event]:
    """Both ranks of node b killed; the survivors on node a leave with the peer-lost code."""
    return [verdict("process_exit", 2, t, pid=102, sig=9),
            verdict("process_exit", 3, t + 40_000, pid=103, sig=9),
            verdict("process_exit", 0, t + 90_000, pid=100, exit_code=3),
            verdict("process_exit", 1, t + 95_000, pid=101, exit_code=3)]


def test_a_lost_node_moves_every_rank_it_held_to_spares_outside_it() -> None:
    for by_label, domain in ((False, "node=b"), (True, "drill_node=b")):
        s = two_nodes({"spare-a0": "a", "spare-a1": "a", "spare-b": "b"}, by_label=by_label)
        s, out = settled(s, node_b_lost(10 * S), 10 * S + 100_000)
        assert [d.command.action for d in out] == [CommandAction.MIGRATE], by_label
        p = migrate(out[0])
        assert (p.rank, p.ranks, p.from_units) == (2, [2, 3], ["u2", "u3"])
        assert p.avoid_domains == [domain]  # node a still runs ranks 0-1: not down
        assert len(p.covered_verdicts) == 3


def test_a_lost_node_without_enough_healthy_spares_escalates_never_shrinks() -> None:
    # two spares, but one is on the node that just failed: one healthy spare for two ranks
    s = two_nodes({"spare-a0": "a", "spare-b": "b"})
    _, out = settled(s, node_b_lost(10 * S), 10 * S + 100_000)
    assert [d.command.action for d in out] == [CommandAction.ESCALATE]
    reason = out[0].command.params.reason
    assert "ranks [2, 3]" in reason and "1 healthy spare" in reason
    assert "node=b" in reason and "not shrunk" in reason


def test_a_node_level_verdict_moves_every_rank_bound_there() -> None:
    s = two_nodes({"spare-a0": "a", "spare-a1": "a", "spare-b": "b"})
    _, out = settled(s, [verdict("link_down", None, 10 * S, node="b")], 10 * S)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]
    p = migrate(out[0])
    assert (p.ranks, p.avoid_domains) == ([2, 3], ["node=b"])


def test_a_silent_node_moves_every_rank_bound_there_and_covers_their_rank_verdicts() -> None:
    s = two_nodes({"spare-a0": "a", "spare-a1": "a", "spare-b": "b"})
    _, out = settled(s, [verdict("node_silent", None, 10 * S, node="b"),
                         verdict("rank_silent", 3, 10 * S + 1, node="b")], 10 * S + 1)
    assert [(d.command.action, d.command.tier) for d in out] == [(CommandAction.MIGRATE, 2)]
    p = migrate(out[0])
    assert (p.rank, p.ranks, p.from_units) == (2, [2, 3], ["u2", "u3"])
    assert p.resume and p.avoid_domains == ["node=b"]  # never onto the spare on node b
    assert len(p.covered_verdicts) == 1


def test_independent_failures_together_move_each_rank_without_blaming_a_node() -> None:
    s = two_nodes({"spare-a0": "a", "spare-b": "b"})
    _, out = settled(s, [verdict("process_exit", 1, 10 * S, pid=101, exit_code=1),
                         verdict("rank_silent", 3, 10 * S + 1)], 10 * S + 1)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]
    p = migrate(out[0])
    assert (p.rank, p.ranks, p.avoid_domains) == (1, [1, 3], [])


def test_only_peer_lost_exits_move_the_earliest_as_before() -> None:
    # a hung rank makes its peers time out: only consequences are seen; the earliest moves
    s = two_nodes({"spare-a0": "a"})
    _, out = settled(s, [verdict("process_exit", 2, 10 * S + 5, pid=102, exit_code=3),
                         verdict("process_exit", 0, 10 * S, pid=100, exit_code=3)], 10 * S)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]
    assert migrate(out[0]).ranks == [0]


def test_a_rank_failing_by_its_own_code_restarts_in_place_and_a_killed_one_moves() -> None:
    # exit code 1 (an exception): its unit is fine and a spare would fail the same way; even
    # with no spare at all, the job resumes in place from the last valid checkpoint
    for spares in (0, 1):
        _, out = settled(pool(spares=spares),
                         [verdict("process_exit", 2, 10 * S, pid=102, exit_code=1),
                          verdict("process_exit", 0, 10 * S + 5, pid=100, exit_code=3)],
                         10 * S + 5)
        assert [(d.command.action, d.command.tier, d.command.params.rank) for d in out] == [
            (CommandAction.RESUME, 3, 2)]
    # killed (a signal, or 128 + a signal from a launcher in between), or status unread: moved
    for sig, code in ((9, None), (None, 137), (None, None)):
        _, out = settled(pool(), [verdict("process_exit", 2, 10 * S, pid=102, sig=sig,
                                          exit_code=code)], 10 * S)
        assert [d.command.action for d in out] == [CommandAction.MIGRATE], (sig, code)
    # one rank's code and another rank killed together: the killed one decides (moved)
    _, out = settled(pool(spares=2), [verdict("process_exit", 2, 10 * S, pid=102, exit_code=1),
                                      verdict("process_exit", 1, 10 * S + 3, pid=101, sig=9)],
                     10 * S + 3)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]


def test_exits_whose_status_nobody_read_move_only_the_earliest() -> None:
    # under Slurm slurmstepd reaps the ranks: every exit comes with neither code nor signal.
    # The killed rank ends first, its peers after; one rank moves, not all three
    s = two_nodes({"spare-a0": "a", "spare-b": "b"})
    _, out = settled(s, [verdict("process_exit", 0, 10 * S + 74_000, pid=100),
                         verdict("process_exit", 1, 10 * S, pid=101, node="a"),
                         verdict("process_exit", 2, 10 * S + 76_000, pid=102, node="b")],
                     10 * S + 76_000)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]
    p = migrate(out[0])
    assert (p.rank, p.ranks, p.avoid_domains) == (1, [1], [])
    assert len(p.covered_verdicts) == 2


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_the_unread_exit_that_said_nothing_is_the_cause_whichever_is_read_first(
        order: tuple[int, ...]) -> None:
    # CI's slurm-rank-kill: rank 1 was SIGKILLed (it says nothing); ranks 0 and 2 said they
    # lost a peer. Which agent reads its exit first is a race (rank 2's came 19 ms before the
    # killed rank's): the rank that said nothing moves, read first or last
    s = two_nodes({"spare-a0": "a", "spare-b": "b"})
    said = {0: (3, "peer_lost"), 1: None, 2: (3, "peer_lost")}
    times = {rank: 10 * S + 19_000 * order[rank] for rank in said}
    _, out = settled(s, [verdict("process_exit", r, times[r], pid=100 + r,
                                 node="a" if r < 2 else "b", said=said[r]) for r in said],
                     max(times.values()))
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]
    p = migrate(out[0])
    assert (p.rank, p.ranks) == (1, [1])
    assert len(p.covered_verdicts) == 2


def test_a_declaration_is_read_like_a_status_where_no_status_was_read() -> None:
    # unread, said it failed by its own error: restarted in place, like a read code 1
    _, out = settled(pool(), [verdict("process_exit", 2, 10 * S, pid=102,
                                      said=(1, "error"))], 10 * S)
    assert [(d.command.action, d.command.tier) for d in out] == [(CommandAction.RESUME, 3)]
    # said it lost a peer (an uncaught gloo error: code 1) and ended with that code: a
    # consequence, so the one killed by a signal is the cause
    _, out = settled(pool(spares=2), [
        verdict("process_exit", 2, 10 * S, pid=102, exit_code=1, said=(1, "peer_lost")),
        verdict("process_exit", 1, 10 * S + 3, pid=101, sig=9)], 10 * S + 3)
    assert [(d.command.action, migrate(d).ranks) for d in out] == [(CommandAction.MIGRATE, [1])]
    # said it lost a peer but ended otherwise (another code, or a signal): judged by how it ended
    for sig, code, action in ((9, None, CommandAction.MIGRATE),
                              (None, 2, CommandAction.RESUME)):
        _, out = settled(pool(), [verdict("process_exit", 2, 10 * S, pid=102, sig=sig,
                                          exit_code=code, said=(1, "peer_lost"))], 10 * S)
        assert [d.command.action for d in out] == [action], (sig, code)


def test_a_lost_node_explains_the_unread_exits_of_its_peers() -> None:
    s = two_nodes({"spare-a0": "a", "spare-a1": "a", "spare-b": "b"})
    _, out = settled(s, [verdict("process_exit", 0, 10 * S, pid=100, node="a"),
                         verdict("node_silent", None, 10 * S + 1, node="b")], 10 * S + 1)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]
    p = migrate(out[0])
    assert (p.ranks, p.avoid_domains) == ([2, 3], ["node=b"])  # rank 0 stays where it is


NODES = st.sampled_from(["a", "b", "c"])


@given(st.lists(NODES, min_size=2, max_size=5), st.lists(NODES, max_size=5),
       st.sets(st.integers(0, 4), min_size=1), st.booleans())
@settings(max_examples=200, deadline=None)
def test_failed_ranks_all_move_outside_the_failed_domain_or_escalate(
        rank_nodes: list[str], spare_nodes: list[str], killed: set[int],
        by_label: bool) -> None:
    from trainguard.actuators.pool import choose_spares, domains, parse_domains
    killed = {r for r in killed if r < len(rank_nodes)} or {0}
    s = PolicyState()
    units: list[tuple[str, str, int | None]] = [(f"u{r}", n, r)
                                                 for r, n in enumerate(rank_nodes)]
    units += [(f"spare{i}", n, None) for i, n in enumerate(spare_nodes)]
    for name, node, rank in units:
        host, labels = ("host", {"drill_node": node}) if by_label else (node, {})
        s, _ = policy.step(s, placed(name, UnitState.BOUND if rank is not None
                                     else UnitState.SPARE, host, rank,
                                     None if rank is None else 100 + rank, labels), 0, CFG)
    events = [verdict("process_exit", r, 10 * S + r, pid=100 + r,
                      sig=9 if r in killed else None, exit_code=None if r in killed else 3)
              for r in range(len(rank_nodes))]
    _, out = settled(s, events, 10 * S + 10)
    assert len(out) == 1  # one decision for the whole failure
    cmd = out[0].command
    survivors = {rank_nodes[r] for r in range(len(rank_nodes)) if r not in killed}
    # a node is down when ranks failed together and none of its ranks survived
    dead_nodes = ({rank_nodes[r] for r in killed} - survivors) if len(killed) > 1 else set()
    outside = [u for u in s.pool.spares_for(JOB)
               if (u.labels.get("drill_node") if by_label else u.node) not in dead_nodes]
    if by_label and not survivors and len(dead_nodes) > 1:
        # every rank died, on several nodes of one machine: the machine is what they share
        assert cmd.action is CommandAction.ESCALATE and "not shrunk" in cmd.params.reason
        return
    if len(outside) < len(killed):
        assert cmd.action is CommandAction.ESCALATE
        assert "not shrunk" in cmd.params.reason
        return
    assert cmd.action is CommandAction.MIGRATE
    mp = migrate(out[0])
    assert mp.ranks == sorted(killed)
    avoid = parse_domains(mp.avoid_domains)
    label = "drill_node" if by_label else "node"
    assert {v for k, v in avoid if k == label} == dead_nodes
    # what the actuator will do with it: a distinct healthy spare for every failed rank
    bound = s.pool.bound(JOB)
    plan = choose_spares(s.pool, JOB, {r: bound[r] for r in killed}, {}, avoid)
    assert plan.missing is None and sorted(plan.moves) == sorted(killed)
    chosen = [c.unit for c in plan.moves.values() if c.unit is not None]
    assert len({u.name for u in chosen}) == len(killed)
    assert not any(domains(u) & avoid for u in chosen)


def test_an_oom_killed_rank_migrates_like_an_exit_and_a_node_notice_does_nothing() -> None:
    _, out = settled(pool(), [verdict("oom_kill", 2, 10 * S, pid=102)], 12 * S)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]
    params = migrate(out[0])
    assert (params.rank, params.resume, params.reason) == (2, True, "oom_kill")
    for kind in ("oom_kill_process", "external_fault"):
        _, out = settled(pool(), [verdict(kind, None, 10 * S)], 12 * S)
        assert out == [], kind


def test_a_silence_decided_from_a_backlog_waits_for_the_backlog_to_resolve_it() -> None:
    """After a broker outage the agents' spools flush one after another: the streams decide
    node b silent from node a's flushed records before node b's arrive, and resolve it when
    they do. Read 12 s after it was decided (a backlog), the job's failures are held
    ``backlog_settle_s``, not ``settle_s``: the resolution comes in time and nothing moves; a
    real loss read the same way still moves, that much later."""
    s = two_nodes({"spare-a0": "a", "spare-a1": "a", "spare-b": "b"})
    late = 22 * S  # decided at 10 s, read at 22 s
    wrong = verdict("node_silent", None, 10 * S, node="b")
    s, out = settled(s, [wrong], late)
    assert out == []  # settle_s passed, the backlog settle not
    assert isinstance(wrong.payload, Verdict)
    s, out = feed(s, [verdict("node_silent", None, 10 * S, node="b",
                              vid=wrong.payload.verdict_id, state=VerdictState.RESOLVED)],
                  late + 5 * S)
    s, out2 = feed(s, [], late + int(CFG.backlog_settle_s * S) + 1)
    assert out + out2 == []  # resolved while held: nothing moved, nothing escalated

    s = two_nodes({"spare-a0": "a", "spare-a1": "a", "spare-b": "b"})
    s, out = settled(s, [verdict("node_silent", None, 10 * S, node="b")], late)
    assert out == []
    _, out = feed(s, [], late + int(CFG.backlog_settle_s * S))
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]
    # read at once (no backlog): after settle_s only, as before
    _, out = settled(two_nodes({"spare-a0": "a", "spare-a1": "a", "spare-b": "b"}),
                     [verdict("node_silent", None, 10 * S, node="b")], 12 * S)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]
    # an exit by a signal read late is no silence: it is its own cause, it needs no wait
    _, out = settled(pool(), [verdict("process_exit", 0, 10 * S, sig=9)], late)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]


def test_a_survivors_exit_read_from_a_backlog_waits_for_the_silence_that_explains_it() -> None:
    """A node lost during a broker outage: the survivors' exits (status unread: presumed
    consequences), decided on arrival, reach decide before the lost node's silence (the
    2026-12-07 slurm-node-loss-broker-outage run with the streams' backlog hold: decide moved
    the first survivor alone, onto a plan that kept the lost node). Read late, they are held
    ``backlog_settle_s``; the silence that comes meanwhile is covered by the same migrate,
    which moves the lost node's rank."""
    s = two_nodes({"spare-a0": "a", "spare-a1": "a", "spare-b": "b"})
    late = 22 * S
    exits = [verdict("process_exit", r, 10 * S) for r in (0, 1)]
    s, out = settled(s, exits, late)
    assert out == []  # settle_s passed, the backlog settle not
    s, out = feed(s, [verdict("node_silent", None, 8 * S, node="b")], late + 5 * S)
    assert out == []  # itself read from the backlog: the hold runs from its reading
    _, out = feed(s, [], late + 5 * S + int(CFG.backlog_settle_s * S) + 1)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]
    params = out[0].command.params
    assert isinstance(params, MigrateParams)
    assert "node=b" in params.avoid_domains and params.reason == "node_silent"


def test_a_refused_restart_is_decided_afresh_when_the_silence_that_explains_it_arrives() -> None:
    """The survivors' exits read in time to miss the backlog hold (under 5 s late: CI's
    2026-12-07 slurm-node-loss-broker-outage runs 20261207072301ff51 and 20261207100340e967):
    decide moved survivor rank 0 alone, the actuator refused (the lost node, kept, cannot reach
    the job's storage: nothing fenced), and every retry repeated that plan for ten minutes
    while the lost node's silence sat open. Once the silence arrives, the retry comes a settle
    later (not after its backoff) and is decided afresh: it moves the lost node's ranks, onto
    no spare of that node, and covers the exits."""
    s = two_nodes({"spare-a0": "a", "spare-a1": "a", "spare-b": "b"})
    exits = [verdict("process_exit", r, 20 * S) for r in (0, 1)]
    s, (first,) = settled(s, exits, 21 * S)
    assert migrate(first).ranks == [0]  # the presumed cause: the earliest exit
    s, out = _refused(s, first, 22 * S)
    assert out == []
    silence = verdict("node_silent", None, 8 * S, node="b")
    s, out = feed(s, [silence], 25 * S)
    assert out == []  # covered by the restart under way: no second command beside it
    assert s.retries[JOB].due_at == 25 * S + int(CFG.settle_s * S)  # not its 5 s backoff
    s, (again,) = feed(s, [], s.retries[JOB].due_at)
    p = migrate(again)
    assert isinstance(silence.payload, Verdict)
    assert again.command.cause_verdict_ids == [silence.payload.verdict_id]
    assert (p.reason, p.ranks, p.from_units, p.avoid_domains) == (
        "node_silent", [2, 3], ["u2", "u3"], ["node=b"])
    assert sorted(p.covered_verdicts) == sorted(
        e.payload.verdict_id for e in exits if isinstance(e.payload, Verdict))
    s, out = _refused(s, again, 30 * S)  # refused again: the same (new) plan, the budget on
    s, (third,) = feed(s, [], s.retries[JOB].due_at)
    assert migrate(third) == p and third.command.idempotency_key not in (
        first.command.idempotency_key, again.command.idempotency_key)
    assert s.pending[third.command.idempotency_key].retry_since == 22 * S


# --- a job the scheduler ended -------------------------------------------------------------


def job_ended(t: int, end: SchedulerEnd = SchedulerEnd.CANCELLED) -> Event:
    return make_event(JobEnded(end=end, allocation="slurm:7", state=end.value.upper()),
                      event_id=derived_id("ended", t), job_id=JOB, event_time=t, source="test")


def scancelled(t: int, ranks: int = 4) -> list[Event]:
    """Every rank killed at once by the scheduler: exits nobody read, nobody declared."""
    return [verdict("process_exit", r, t + 1_000 * r, pid=100 + r) for r in range(ranks)]


def test_exits_nobody_accounted_for_wait_for_the_schedulers_word_and_it_ends_the_job() -> None:
    s = pool()
    s, out = feed(s, scancelled(10 * S), 10 * S)
    s, out = feed(s, [], 10 * S + int(CFG.settle_s * S))
    assert out == []  # the normal window is over; the job waits for the actuator's word
    s, out = feed(s, [job_ended(10 * S + int(1.5 * S))], 10 * S + int(1.5 * S))
    assert out == []
    s, out = feed(s, [], 10 * S + int(CFG.scheduler_settle_s * S) + 1)
    assert out == [] and s.held == {} and JOB in s.stopped
    # later verdicts and ladders of the ended job move nothing, and nobody is called
    s, out = settled(s, [verdict("straggler", 2, 20 * S), verdict("rank_silent", 1, 20 * S)],
                     20 * S)
    assert out == []


def test_sigterm_exits_wait_for_the_schedulers_word_too() -> None:
    """A torchrun job under ``scancel``: each agent stops its workers with SIGTERM, so the
    exits are read with signal 15 (drill run 2026120720570234b1 escalated on them 0.8 s
    before ``job.ended`` arrived); they wait ``scheduler_settle_s``. A SIGKILL does not."""
    s = pool()
    term = [verdict("process_exit", r, 10 * S + r, pid=100 + r, sig=15) for r in range(3)]
    s, out = feed(s, term, 10 * S)
    s, out = feed(s, [], 10 * S + int(CFG.settle_s * S) + 10)
    assert out == []
    s, out = feed(s, [job_ended(12 * S)], 12 * S)
    s, out = feed(s, [], 10 * S + int(CFG.scheduler_settle_s * S) + 10)
    assert out == [] and JOB in s.stopped
    s = pool(spares=1)
    s, out = feed(s, [verdict("process_exit", 1, 10 * S, pid=101, sig=9)], 10 * S)
    s, out = feed(s, [], 10 * S + int(CFG.settle_s * S))
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]


def test_without_the_schedulers_word_the_unaccounted_exits_are_decided_after_its_wait() -> None:
    s = pool()
    s, _ = feed(s, scancelled(10 * S, ranks=1), 10 * S)
    s, out = feed(s, [], 10 * S + int(CFG.scheduler_settle_s * S) - 1)
    assert out == []
    s, out = feed(s, [], 10 * S + int(CFG.scheduler_settle_s * S))
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]


def test_one_exit_that_accounts_for_itself_brings_back_the_normal_window() -> None:
    # a rank killed alone says nothing, but its peers say at once that they lost it
    s = pool(spares=1)
    events = [verdict("process_exit", 1, 10 * S, pid=101),
              verdict("process_exit", 0, 10 * S + 5, pid=100, said=(3, "peer_lost"))]
    s, out = feed(s, events, 10 * S + 5)
    s, out = feed(s, [], 10 * S + 5 + int(CFG.settle_s * S))
    assert [(d.command.action, migrate(d).ranks) for d in out] == [(CommandAction.MIGRATE, [1])]


def test_a_job_ended_under_its_restart_drops_the_restart_and_calls_nobody() -> None:
    s, out = settled(pool(), [verdict("rank_silent", 0, 10 * S)], 10 * S)
    assert [d.command.action for d in out] == [CommandAction.MIGRATE]
    s, more = feed(s, [job_ended(11 * S, SchedulerEnd.TIMEOUT),
                       outcome(out[0], OutcomeStatus.FAILED, 11 * S, "migrate: the scheduler "
                               "ended the job's allocation slurm:7 (TIMEOUT)")], 11 * S)
    assert more == [] and s.pending == {} and s.ended == {JOB: SchedulerEnd.TIMEOUT}
    s, more = feed(s, [], 11 * S + int(CFG.outcome_timeout_s * S) + 1)
    assert more == []


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf")])
@pytest.mark.parametrize("name", ["settle_s", "scheduler_settle_s", "outcome_timeout_s"])
def test_a_policy_duration_that_is_negative_or_not_finite_is_refused(name: str,
                                                                     value: float) -> None:
    with pytest.raises(ValueError, match=f"{name}: must be >= 0 and finite"):
        PolicyConfig(**{name: value})  # type: ignore[arg-type]
