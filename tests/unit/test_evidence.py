"""Evidence checks on synthetic drill logs: a clean recovery is concluded "recovered
automatically" only with events cited; each thing a bad recovery gets wrong is caught by the
check that owns it and moves the conclusion away from "recovered"."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.drills.evidence import Check, Conclusion, EvidenceInput, evaluate
from trainguard.drills.evidence.conclusion import conclude
from trainguard.drills.evidence.evaluate import Evaluation
from trainguard.drills.evidence.model import Artifacts, Status
from trainguard.drills.scenario import Expect
from trainguard.drills.synth import JOB, Knobs, synth_drill
from trainguard.events.payloads import StepReport, VerdictKind

EXPECT = Expect(verdicts=(VerdictKind.PROCESS_EXIT,), actions=("migrate",), resumed=True,
                incident="recovered")


def run(k: Knobs | None = None, expect: Expect = EXPECT, tol: float = 1e-3,
        artifacts: Any = "synth", baseline: Any = "synth") -> Evaluation:
    events, b, a = synth_drill(k or Knobs())
    return evaluate(EvidenceInput(JOB, events, expect, tol, 10,
                                  b if baseline == "synth" else baseline,
                                  a if artifacts == "synth" else artifacts))


def status(ev: Evaluation, name: str) -> Status:
    return next(c.status for c in ev.checks if c.name == name)


def test_a_clean_recovery_is_recovered_automatically_with_every_pass_citing_events() -> None:
    ev = run()
    assert ev.conclusion is Conclusion.RECOVERED_AUTOMATICALLY, ev.reasons
    kinds = {c.kind for c in ev.checks}
    assert kinds == {"progress", "resources", "results"}
    for c in ev.checks:
        assert c.status is Status.PASS, (c.name, c.detail)
        assert c.event_ids and len(c.event_ids) == len(c.times)
    resumed = next(c for c in ev.checks if c.name == "resumed_from_last_valid_checkpoint")
    assert "first step is 21 at position 1344 = checkpoint step 20" in resumed.detail
    assert all(c.status is Status.PASS for c in ev.expectations)
    assert ev.timings["steps_redone"] == 5  # steps 21..25 ran twice: lost work, not data
    assert ev.timings["detected_s"] == pytest.approx(0.002)
    t = ev.timings  # the heal's phases in their order: the restore between launch and step
    order = ["detected_s", "first_command_s", "fenced_s", "bound_s", "restored_s",
             "first_step_after_s"]
    assert all(isinstance(t[k], float) for k in order), t
    assert [t[k] for k in order] == sorted(t[k] for k in order), t  # type: ignore[type-var]


@pytest.mark.parametrize(("knobs", "check", "want", "conclusion"), [
    ({"resume_offset": -3}, "resumed_from_last_valid_checkpoint", Status.FAIL,
     Conclusion.NEEDS_MANUAL_RESTART),
    ({"resume_offset": -3}, "no_step_repeated_beyond_checkpoint", Status.FAIL,
     Conclusion.NEEDS_MANUAL_RESTART),
    ({"resume_offset": 4}, "no_step_skipped", Status.FAIL, Conclusion.NEEDS_MANUAL_RESTART),
    ({"position_offset": 32}, "no_data_consumed_twice", Status.FAIL,
     Conclusion.NEEDS_MANUAL_RESTART),
    ({"from_zero": True}, "not_restarted_from_zero", Status.FAIL,
     Conclusion.NEEDS_MANUAL_RESTART),
    ({"duplicate": True}, "no_duplicate_replica", Status.FAIL, Conclusion.NEEDS_MANUAL_RESTART),
    ({"no_fence": True}, "old_replica_stopped_before_new_started", Status.FAIL,
     Conclusion.NEEDS_MANUAL_RESTART),
    ({"bind_before_fence": True}, "old_replica_stopped_before_new_started", Status.FAIL,
     Conclusion.NEEDS_MANUAL_RESTART),
    ({"temp_left": True}, "old_resources_released", Status.FAIL,
     Conclusion.NEEDS_MANUAL_RESTART),
    ({"cpus_changed": True}, "new_binding_kept_quota_and_permissions", Status.FAIL,
     Conclusion.NEEDS_MANUAL_RESTART),
    ({"uid_changed": True}, "new_binding_kept_quota_and_permissions", Status.FAIL,
     Conclusion.NEEDS_MANUAL_RESTART),
    ({"loss_drift": 0.05}, "loss_within_tolerance_of_baseline", Status.FAIL,
     Conclusion.NEEDS_MANUAL_CONFIRMATION),
    ({"broken_file": True}, "checkpoint_files_intact", Status.FAIL,
     Conclusion.NEEDS_MANUAL_CONFIRMATION),
    ({"lose_report": True}, "no_step_skipped", Status.UNEXPLAINED, Conclusion.RETEST),
    ({"no_resume": True}, "progressed_after_fault", Status.FAIL,
     Conclusion.NEEDS_MANUAL_RESTART),
])
def test_each_bad_recovery_is_caught(knobs: dict[str, Any], check: str, want: Status,
                                     conclusion: Conclusion) -> None:
    ev = run(Knobs(**knobs))
    assert status(ev, check) is want, [(c.name, c.status, c.detail) for c in ev.checks]
    assert ev.conclusion is conclusion, ev.reasons


def test_the_loss_is_compared_up_to_the_horizon_after_a_resume() -> None:
    # fp summation order after a resume lets last-bit differences grow: a drift that begins
    # past the horizon is that, not a wrong resume; one inside it is caught
    from trainguard.drills.evidence.results import LOSS_HORIZON
    late = run(Knobs(steps_after=LOSS_HORIZON + 20, loss_drift=0.05, drift_after=LOSS_HORIZON))
    assert status(late, "loss_within_tolerance_of_baseline") is Status.PASS
    assert late.conclusion is Conclusion.RECOVERED_AUTOMATICALLY, late.reasons
    early = run(Knobs(steps_after=LOSS_HORIZON + 20, loss_drift=0.05,
                      drift_after=LOSS_HORIZON - 1))
    assert status(early, "loss_within_tolerance_of_baseline") is Status.FAIL


def test_a_corrupt_newest_checkpoint_is_skipped_and_explained() -> None:
    k = Knobs(corrupt_newest=True)
    ev = run(k, dataclasses.replace(EXPECT, checkpoint_corrupt=True))
    assert ev.conclusion is Conclusion.RECOVERED_AUTOMATICALLY, ev.reasons
    detail = next(c.detail for c in ev.checks if c.name == "resumed_from_last_valid_checkpoint")
    assert "checkpoint step 10" in detail and "corrupt checkpoint(s) [20] skipped" in detail
    # resuming from the corrupt one anyway is caught
    bad = run(dataclasses.replace(k, ignore_corrupt=True),
              dataclasses.replace(EXPECT, checkpoint_corrupt=True))
    assert status(bad, "resumed_from_last_valid_checkpoint") is Status.FAIL
    # a corruption nobody injected is not silently accepted
    unexpected = run(k)
    assert unexpected.conclusion is Conclusion.NEEDS_MANUAL_CONFIRMATION
    assert any("checkpoint_corrupt" in r for r in unexpected.reasons)


def test_no_baseline_or_no_disk_inspection_means_retest() -> None:
    assert run(baseline=None).conclusion is Conclusion.RETEST
    ev = run(artifacts=None)
    assert ev.conclusion is Conclusion.RETEST
    assert status(ev, "checkpoint_files_intact") is Status.UNEXPLAINED


def test_an_unexpected_path_needs_manual_confirmation_even_when_evidence_passes() -> None:
    ev = run(expect=dataclasses.replace(EXPECT, actions=("raise_quota",)))
    assert ev.conclusion is Conclusion.NEEDS_MANUAL_CONFIRMATION
    assert any("action:raise_quota" in r for r in ev.reasons)


def test_an_unrecoverable_job_is_called_so() -> None:
    events, b, _ = synth_drill(Knobs(no_resume=True))
    gone = Artifacts(checkpoints=(), temp_files=(), max_live_replicas={0: 1, 1: 1})
    ev = evaluate(EvidenceInput(JOB, events, EXPECT, 1e-3, 10, b, gone))
    assert ev.conclusion is Conclusion.UNRECOVERABLE, ev.reasons


def test_a_census_that_saw_two_live_processes_fails_the_duplicate_check() -> None:
    events, b, a = synth_drill(Knobs())
    seen = dataclasses.replace(a, max_live_replicas={0: 1, 1: 2})
    ev = evaluate(EvidenceInput(JOB, events, EXPECT, 1e-3, 10, b, seen))
    assert status(ev, "no_duplicate_replica") is Status.FAIL


def test_conclude_never_passes_on_green_alone() -> None:
    green = [Check(k, f"{k}-x", Status.PASS, "ok") for k in ("progress", "resources",
                                                              "results")]
    got, why = conclude(green, [], escalated=False, unrecoverable=False)
    assert got is Conclusion.RETEST and "without citing an event" in why[0]
    cited = [dataclasses.replace(c, event_ids=("e1",), times=(1,)) for c in green]
    got, _ = conclude(cited, [], escalated=False, unrecoverable=False)
    assert got is Conclusion.RETEST  # no progressed_after_fault among them
    nothing = [Check(k, "n", Status.NOT_APPLICABLE, "-") for k in ("progress", "resources",
                                                                   "results")]
    assert conclude(nothing, [], escalated=False, unrecoverable=False)[0] is Conclusion.RETEST
    assert conclude(cited[:2], [], escalated=False, unrecoverable=False)[0] is Conclusion.RETEST


def test_evaluation_round_trips_through_json_dicts() -> None:
    ev = run(Knobs(corrupt_newest=True))
    assert Evaluation.from_dict(ev.to_dict()) == ev


MUTATIONS: list[dict[str, Any]] = [
    {"resume_offset": -2}, {"resume_offset": 2}, {"position_offset": 64}, {"from_zero": True},
    {"duplicate": True}, {"no_fence": True}, {"bind_before_fence": True},
    {"loss_drift": 0.5}, {"broken_file": True}, {"temp_left": True}, {"cpus_changed": True},
    {"uid_changed": True}, {"no_resume": True}, {"lose_report": True},
]


@st.composite
def clean_knobs(draw: st.DrawFn) -> Knobs:
    world = draw(st.integers(1, 4))
    every = draw(st.integers(1, 8))
    before = draw(st.integers(every + 1, 30))
    return Knobs(world=world, ckpt_every=every, steps_before=before,
                 steps_after=draw(st.integers(10, 25)), batch=draw(st.integers(1, 64)),
                 victim=draw(st.integers(0, world - 1)))


@settings(max_examples=60, deadline=None)
@given(clean_knobs(), st.randoms(use_true_random=False))
def test_any_clean_recovery_is_recovered_and_order_does_not_matter(k: Knobs,
                                                                   rnd: random.Random) -> None:
    events, b, a = synth_drill(k)
    ev = evaluate(EvidenceInput(JOB, events, EXPECT, 1e-3, 10, b, a))
    assert ev.conclusion is Conclusion.RECOVERED_AUTOMATICALLY, ev.reasons
    shuffled = list(events)
    rnd.shuffle(shuffled)
    assert evaluate(EvidenceInput(JOB, shuffled, EXPECT, 1e-3, 10, b, a)) == ev


@settings(max_examples=80, deadline=None)
@given(clean_knobs(), st.sampled_from(MUTATIONS))
def test_no_broken_recovery_is_ever_called_recovered(k: Knobs, mutation: dict[str, Any]) -> None:
    if mutation.get("resume_offset", 0) < 0 and k.ckpt_every + mutation["resume_offset"] < 0:
        mutation = {"resume_offset": -1}
    if mutation.get("lose_report") and k.world == 1:
        mutation = {"no_fence": True}
    events, b, a = synth_drill(dataclasses.replace(k, **mutation))
    ev = evaluate(EvidenceInput(JOB, events, EXPECT, 1e-3, 10, b, a))
    assert ev.conclusion is not Conclusion.RECOVERED_AUTOMATICALLY, (mutation, ev.reasons)


def test_other_jobs_events_are_ignored() -> None:
    events, b, a = synth_drill(Knobs())
    other = [e.model_copy(update={"job_id": "other", "event_id": "x" + e.event_id})
             for e in events if e.type == "step.report"][:5]
    moved = [e.model_copy(update={"event_time": e.event_time + 1}) for e in other]
    base = evaluate(EvidenceInput(JOB, events, EXPECT, 1e-3, 10, b, a))
    assert evaluate(EvidenceInput(JOB, events + moved, EXPECT, 1e-3, 10, b, a)) == base


def test_a_record_delivered_twice_counts_once() -> None:
    """At-least-once delivery: an agent cut off before its send's ack sends the record again
    from its spool (the head-partition drill logged two step reports twice, and the evidence
    called the same step "reported twice by one process": unexplained, retest)."""
    events, b, a = synth_drill(Knobs())
    twice = [e for e in events if e.type == "step.report"][10:14]
    base = evaluate(EvidenceInput(JOB, events, EXPECT, 1e-3, 10, b, a))
    again = evaluate(EvidenceInput(JOB, events + twice, EXPECT, 1e-3, 10, b, a))
    assert base.conclusion is Conclusion.RECOVERED_AUTOMATICALLY
    assert again == base


def test_a_rank_bound_again_on_the_lost_node_is_not_recovered() -> None:
    events, b, a = synth_drill(Knobs())
    ok = evaluate(EvidenceInput(JOB, events, EXPECT, 1e-3, 10, b, a, lost_node="elsewhere"))
    assert ok.conclusion is Conclusion.RECOVERED_AUTOMATICALLY
    # every synthetic unit sits on node "n": losing it and binding there again is caught
    lost = evaluate(EvidenceInput(JOB, events, EXPECT, 1e-3, 10, b, a, lost_node="n"))
    check = next(c for c in lost.expectations if c.name == "nothing_rebound_on:n")
    assert check.status is Status.FAIL and "rank 0 on u0" in check.detail
    assert lost.conclusion is Conclusion.NEEDS_MANUAL_CONFIRMATION


def _slowdown_only(recovers: bool, kind: str = "job_slowdown") -> list[Any]:
    """A fault, then a verdict of ``kind`` and its incident (recovered or not); no command."""
    from trainguard.drills.synth import _Log
    from trainguard.events.payloads import (
        IncidentState,
        IncidentTransition,
        Injection,
        Verdict,
        VerdictState,
    )
    log = _Log()
    t = 1_700_000_000_000_000
    log.add(Injection(drill_id="d", scenario="s", fault="link", phase="start", target="link"), t)
    log.add(Verdict(verdict_id="v1", rule=kind, kind=kind, state=VerdictState.OPEN,
                    severity="warning", first_anomalous_time=t, decided_time=t + 10), t + 10)
    log.add(IncidentTransition(incident_id="i1", seq=0, to_state=IncidentState.DETECTED), t + 11)
    if recovers:
        log.add(IncidentTransition(incident_id="i1", seq=1, from_state=IncidentState.DETECTED,
                                   to_state=IncidentState.RECOVERED), t + 99)
    return log.events


@pytest.mark.parametrize("recovers,kind,tolerate,ok", [
    (True, "job_slowdown", ("job_slowdown",), True),
    (True, "job_slowdown", (), False),  # not tolerated: an unexpected incident
    (False, "job_slowdown", ("job_slowdown",), False),  # tolerated, but it never recovered
    (True, "straggler", ("job_slowdown",), False),  # another kind is not tolerated
])
def test_incident_none_tolerates_only_listed_kinds_that_recovered(
        recovers: bool, kind: str, tolerate: tuple[str, ...], ok: bool) -> None:
    from trainguard.drills.evidence.expectations import expectations
    from trainguard.drills.evidence.log import index
    expect = Expect(actions=(), resumed=False, incident="none",
                    tolerate=tuple(VerdictKind(k) for k in tolerate))
    checks = expectations(index(_slowdown_only(recovers, kind), JOB), expect)
    (check,) = [c for c in checks if c.name == "incident:none"]
    assert (check.status is Status.PASS) is ok, check.detail


def test_a_corrupt_step_written_again_is_valid_for_a_later_restart() -> None:
    # epoch 2 resumes from step 10 (step 20 reported corrupt), reaches step 20 again and
    # writes it anew; epoch 3 then resumes from that new step 20, not from 10
    from trainguard.drills.evidence.log import index
    from trainguard.drills.evidence.progress import restarts
    from trainguard.drills.synth import _Log, _step
    from trainguard.events.payloads import CheckpointAction, CheckpointEvent, Injection
    k = Knobs(world=2)
    log = _Log()
    t = 1_700_000_000_000_000

    def run(epoch: int, first: int, last: int) -> None:
        nonlocal t
        for step in range(first, last + 1):
            t += 1000
            for r in range(k.world):
                _step(log, k, t + r, r, epoch, step, 100 * epoch + r)
            if step % 10 == 0:
                log.add(CheckpointEvent(action=CheckpointAction.WRITTEN, step=step,
                                        samples_consumed=step * 64, path=f"/c/{step}"), t + 50)

    run(1, 1, 22)
    log.add(Injection(drill_id="d", scenario="s", fault="checkpoint_corruption", phase="start",
                      target="checkpoint"), t + 100)
    log.add(CheckpointEvent(action=CheckpointAction.CORRUPT, step=20, samples_consumed=0,
                            path="/c/20"), t + 200)
    t += 1000
    run(2, 11, 25)
    t += 1000
    run(3, 21, 30)
    got = restarts(index(log.events, JOB))
    assert not isinstance(got, str)
    assert [(r.epoch, r.expected_step, r.corrupt_steps) for r in got] == [
        (2, 10, (20,)), (3, 20, ())]


def _drop_reports(events: list[Any], ranks: set[int], steps: range) -> list[Any]:
    """The log without the epoch-1 step reports of ``ranks`` at ``steps``."""
    return [e for e in events if not (
        isinstance(e.payload, StepReport) and e.payload.rank in ranks
        and e.payload.binding_epoch == 1 and e.payload.step in steps)]


def test_reports_lost_with_a_node_are_not_skipped_steps_when_its_peers_ran_them() -> None:
    """A lost node's agent dies with its ranks' last reports: rank 1's epoch 1 ends on the log
    at step 19, epoch 2 resumes from checkpoint 20 at step 21. Its peers reported step 20 in
    lockstep, so it ran it; had nobody reported step 20, the step was skipped."""
    events, b, a = synth_drill(Knobs())
    lost = _drop_reports(events, {1}, range(20, 26))
    ev = evaluate(EvidenceInput(JOB, lost, EXPECT, 1e-3, 10, b, a))
    check = next(c for c in ev.checks if c.name == "no_step_skipped")
    assert check.status is Status.PASS, check.detail
    assert "rank 1: no report of epoch 1 steps 20..20 reached the log" in check.detail
    assert ev.conclusion is Conclusion.RECOVERED_AUTOMATICALLY, ev.reasons
    skipped = _drop_reports(events, {0, 1, 2}, range(20, 26))
    ev = evaluate(EvidenceInput(JOB, skipped, EXPECT, 1e-3, 10, b, a))
    check = next(c for c in ev.checks if c.name == "no_step_skipped")
    assert check.status is Status.FAIL and "epoch 1 ended at step 19" in check.detail


def test_an_elastic_jobs_kept_replicas_need_their_old_workers_gone_first() -> None:
    """An elastic job's migrate keeps the survivors' launchers, bound at the new epoch in
    place (``launch_epoch``): recovered, with nothing fenced for them; but a worker of the old
    epoch reporting after the new epoch began fails the check that the old replica stopped
    first."""
    ev = run(Knobs(world=3, elastic=True))
    assert ev.conclusion is Conclusion.RECOVERED_AUTOMATICALLY, ev.reasons
    check = next(c for c in ev.checks if c.name == "old_replica_stopped_before_new_started")
    assert "2 replica(s) kept at the new epoch" in check.detail
    late = run(Knobs(world=3, elastic=True, late_old_worker=True))
    assert status(late, "old_replica_stopped_before_new_started") is Status.FAIL
    assert late.conclusion is not Conclusion.RECOVERED_AUTOMATICALLY


def test_the_loss_is_compared_by_the_data_shard_a_rank_was_fed() -> None:
    """After an elastic job's swap a slot may be fed another group rank's shard: its loss is
    that shard's, which its ``dp_rank`` says; compared by rank alone it would look wrong."""
    said = run(Knobs(world=3, swap_shards=True))
    assert status(said, "loss_within_tolerance_of_baseline") is Status.PASS
    unsaid = run(Knobs(world=3, swap_shards=True, say_shard=False))
    assert status(unsaid, "loss_within_tolerance_of_baseline") is Status.FAIL
