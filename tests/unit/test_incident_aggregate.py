"""The incident fold on a log shaped like a real run: a throttled rank fixed by tier 1, then a
killed rank migrated to a spare and the job resumed from its last checkpoint."""

from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from trainguard.events.codec import decode, encode, make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    Command,
    CommandAction,
    CommandOutcome,
    IncidentTransition,
    JobEnded,
    OutcomeStatus,
    RestartData,
    RetryCondition,
    SchedulerEnd,
    Severity,
    StepReport,
    Verdict,
    VerdictState,
)
from trainguard.incidents import IncidentSettings, rebuild, rebuild_incidents
from trainguard.incidents.aggregate import incident_id, transition_id
from trainguard.incidents.model import Incident
from trainguard.incidents.state_codec import book_from_doc, book_to_doc
from trainguard.incidents.synth import S, Scenario, incident_log

LOG = incident_log()
SC = Scenario()


def payloads(transitions: list[Event]) -> list[IncidentTransition]:
    out = []
    for t in transitions:
        assert isinstance(t.payload, IncidentTransition)
        out.append(t.payload)
    return out


def path(incident: Incident) -> list[tuple[str, int | None]]:
    return [(p.to_state.value, p.tier) for p in payloads(incident.transitions)]


def incidents(log: list[Event]) -> list[Incident]:
    return list(rebuild_incidents(log)["job-a"].incidents.values())


def verdict_of(log: list[Event], kind: str) -> Event:
    return next(e for e in log if isinstance(e.payload, Verdict) and e.payload.kind == kind
                and e.payload.state is VerdictState.OPEN)


def test_two_faults_two_incidents_with_their_paths() -> None:
    straggler, kill = incidents(LOG)
    assert path(straggler) == [("detected", None), ("located", None), ("mitigating", 1),
                               ("recovered", 1)]
    assert path(kill) == [("detected", None), ("located", None), ("mitigating", 2),
                          ("mitigating", 3), ("recovered", 3)]
    assert straggler.ranks == {SC.slow_rank} and kill.ranks == {SC.kill_rank}


def test_ids_and_times_derive_from_the_causes() -> None:
    _, kill = incidents(LOG)
    opening = verdict_of(LOG, "process_exit")
    assert isinstance(opening.payload, Verdict)
    assert kill.incident_id == incident_id("job-a", opening.payload.verdict_id)
    by_id = {e.event_id: e for e in LOG}
    for t in kill.transitions:
        p = t.payload
        assert isinstance(p, IncidentTransition)
        assert t.event_id == transition_id(kill.incident_id, p.seq)
        assert t.event_time == by_id[p.cause_event_ids[0]].event_time  # never the wall clock
        assert decode(encode(t)) == t  # valid against the contract
    assert kill.transitions[0].event_time == opening.event_time


def test_recovery_waits_for_the_first_step_of_the_new_epoch() -> None:
    without = [e for e in LOG if not (isinstance(e.payload, StepReport)
                                      and e.payload.binding_epoch == 1)]
    _, kill = incidents(without)
    assert kill.state is not None and kill.state.value == "mitigating"
    _, full = incidents(LOG)
    last = payloads(full.transitions)[-1]
    first_new = min((e for e in LOG if isinstance(e.payload, StepReport)
                     and e.payload.binding_epoch == 1), key=lambda e: e.event_time)
    assert first_new.event_id in last.cause_event_ids
    assert full.closed_at == first_new.event_time
    assert "rank 3 epoch 1" in last.reason


def test_recovery_needs_the_verdicts_resolved_when_nothing_was_fenced() -> None:
    resolved = [e for e in LOG if isinstance(e.payload, Verdict) and e.payload.kind ==
                "straggler" and e.payload.state is VerdictState.RESOLVED]
    straggler, _ = incidents([e for e in LOG if e not in resolved])
    assert straggler.state is not None and straggler.state.value == "mitigating"


def _outcome_swap(status: OutcomeStatus, retry: RetryCondition | None = None
                  ) -> Callable[[Event], Event]:
    def swap(e: Event) -> Event:
        p = e.payload
        if isinstance(p, CommandOutcome) and p.action is CommandAction.RESUME and \
                p.status is OutcomeStatus.DONE:
            return e.model_copy(update={"payload": p.model_copy(
                update={"status": status, "detail": "no valid checkpoint",
                        "data": RestartData(action=p.action, retry=retry)})})
        return e
    return swap


def test_a_failed_resume_is_unrecoverable() -> None:
    _, kill = incidents([_outcome_swap(OutcomeStatus.FAILED)(e) for e in LOG])
    assert path(kill)[-1] == ("unrecoverable", 3)
    assert "no valid checkpoint" in payloads(kill.transitions)[-1].reason


def test_a_resume_refused_for_a_retryable_reason_is_not_the_end() -> None:
    swap = _outcome_swap(OutcomeStatus.FAILED, RetryCondition.STORAGE_UNREACHABLE)
    _, kill = incidents([swap(e) for e in LOG])
    assert ("unrecoverable", 3) not in path(kill)  # the policy retries it: still mitigating
    assert kill.state is not None and kill.state.value == "mitigating"


def _event(payload: Verdict | Command, t: int, subject: Subject, key: str) -> Event:
    return make_event(payload, event_id=derived_id("t", key), job_id="job-a", event_time=t,
                      source="test", subject=subject)


def _verdict(vid: str, kind: str, t: int, subject: Subject, sev: Severity = Severity.CRITICAL,
             state: VerdictState = VerdictState.OPEN) -> Event:
    return _event(Verdict(verdict_id=vid, rule=kind, kind=kind, state=state, severity=sev,
                          first_anomalous_time=t, decided_time=t), t, subject, vid + state)


def test_escalation_then_recovery_after_a_human_fixed_it() -> None:
    t = 1_800_000_000_000_000
    v = _verdict("v1", "link_down", t, Subject(node="n1", link="ib0"))
    esc = _event(Command(command_id="c1", idempotency_key="c1", action=CommandAction.ESCALATE,
                         tier=0, issued_at=t + S, issued_by="policy", cause_verdict_ids=["v1"],
                         params={"reason": "no spare in the pool"}), t + S, Subject(), "c1")
    fixed = _verdict("v1", "link_down", t + 60 * S, Subject(node="n1", link="ib0"),
                     state=VerdictState.RESOLVED)
    (inc,) = incidents([v, esc, fixed])
    assert path(inc) == [("detected", None), ("located", None), ("escalated", None),
                         ("recovered", None)]
    assert "no spare in the pool" in payloads(inc.transitions)[2].reason


def test_info_verdicts_open_nothing_and_job_level_verdicts_wait_to_be_located() -> None:
    t = 1_800_000_000_000_000
    info = _verdict("i1", "stage_imbalance", t, Subject(unit="pp_stage:1"), Severity.INFO)
    assert rebuild([info]) == []
    job = _verdict("j1", "job_slowdown", t, Subject(), Severity.WARNING)
    located = _verdict("r1", "straggler", t + 2 * S, Subject(node="n1", rank=5), Severity.WARNING)
    (inc,) = incidents([job, located])
    assert path(inc) == [("detected", None), ("located", None)]
    assert inc.transitions[1].event_time == t + 2 * S


def test_symptoms_within_the_join_window_join_the_open_incident() -> None:
    t = 1_800_000_000_000_000
    first = _verdict("a", "process_exit", t, Subject(node="n1", rank=3))
    peer = _verdict("b", "process_exit", t + 2 * S, Subject(node="n1", rank=0))
    later = _verdict("c", "process_exit", t + 90 * S, Subject(node="n2", rank=7))
    got = incidents([first, peer, later])
    assert [sorted(i.verdicts) for i in got] == [["a", "b"], ["c"]]
    narrow = rebuild_incidents([first, peer], IncidentSettings(join_window_us=S))["job-a"]
    assert len(narrow.incidents) == 2


def test_rebuild_ignores_input_order_and_duplicates() -> None:
    reference = [encode(t) for t in rebuild(LOG)]
    assert len(reference) == 9
    assert [encode(t) for t in rebuild(list(reversed(LOG)) + LOG[::7])] == reference


@pytest.mark.parametrize("drop", ["pool.unit", "checkpoint"])
def test_the_fold_still_ends_when_evidence_types_are_missing(drop: str) -> None:
    # without bindings the resume's first step is the evidence; without the load, any step
    _, kill = incidents([e for e in LOG if e.type != drop])
    assert path(kill)[-1] == ("recovered", 3)


def test_a_whole_job_restart_recovers_only_when_every_rank_stepped_at_the_new_epoch() -> None:
    log = incident_log(Scenario(restart_all=True))
    _, kill = incidents(log)
    assert len(kill.bindings) == SC.ranks and path(kill)[-1] == ("recovered", 3)
    late_rank = [e for e in log if not (isinstance(e.payload, StepReport)
                                        and e.payload.rank == 1 and e.payload.binding_epoch == 1)]
    _, stuck = incidents(late_rank)
    assert stuck.state is not None and stuck.state.value == "mitigating"


def test_an_escalation_naming_no_verdict_joins_by_rank() -> None:
    """The decision service escalates a failed command with the command as its cause (no
    verdict id): the incident holding the rank takes it."""
    t = 1_800_000_000_000_000
    v = _verdict("v9", "process_exit", t, Subject(node="n1", rank=2))
    mig = _event(Command(command_id="m", idempotency_key="m", action=CommandAction.MIGRATE,
                         tier=2, issued_at=t + S, issued_by="policy", cause_verdict_ids=["v9"],
                         params={"rank": 2, "ranks": [2]}), t + S, Subject(rank=2), "m")
    esc = _event(Command(command_id="e", idempotency_key="e", action=CommandAction.ESCALATE,
                         tier=0, issued_at=t + 9 * S, issued_by="policy", cause_verdict_ids=[],
                         params={"reason": "migrate (tier 2) failed: no spare", "rank": 2}),
                 t + 9 * S, Subject(rank=2), "e")
    (inc,) = incidents([v, mig, esc])
    assert path(inc)[-1] == ("escalated", 2)
    assert "no spare" in payloads(inc.transitions)[-1].reason
    other = _event(Command(command_id="o", idempotency_key="o", action=CommandAction.ESCALATE,
                           tier=0, issued_at=t + 9 * S, issued_by="policy",
                           params={"rank": 5}), t + 9 * S, Subject(rank=5), "o")
    (inc,) = incidents([v, mig, other])
    assert path(inc)[-1] == ("mitigating", 2)  # another rank's escalation is not this one's


def _ended(t: int, end: SchedulerEnd, reason: str = "") -> Event:
    return make_event(JobEnded(end=end, allocation="slurm:7", state=end.value.upper(),
                               reason=reason),
                      event_id=derived_id("ended", t), job_id="job-a", event_time=t,
                      source="test")


@pytest.mark.parametrize(("end", "final"), [(SchedulerEnd.CANCELLED, "ended"),
                                            (SchedulerEnd.TIMEOUT, "ended"),
                                            (SchedulerEnd.NODE_FAIL, "unrecoverable")])
def test_the_scheduler_ending_the_job_ends_its_incidents_and_opens_no_more(
        end: SchedulerEnd, final: str) -> None:
    t = 1_800_000_000_000_000
    exits = [_verdict(f"x{r}", "process_exit", t + r, Subject(node="n1", rank=r))
             for r in range(2)]
    later = _verdict("late", "rank_silent", t + 30 * S, Subject(node="n2", rank=3))
    books = rebuild_incidents([*exits, _ended(t + S, end, "TimeLimit"), later])
    (inc,) = books["job-a"].incidents.values()
    assert path(inc) == [("detected", None), ("located", None), (final, None)]
    reason = payloads(inc.transitions)[-1].reason
    assert end.value.upper() in reason and "slurm:7" in reason and "TimeLimit" in reason
    assert inc.terminal and inc.closed_at == t + S
    # the end survives the live fold's snapshot: a verdict after it still opens nothing
    book = book_from_doc(orjson.loads(orjson.dumps(book_to_doc(books["job-a"]))),
                         IncidentSettings())
    assert book.apply(_verdict("later", "node_silent", t + 40 * S, Subject(node="n2"))) == []
    assert len(book.incidents) == 1


def test_every_folded_type_is_on_a_topic_the_incident_service_reads() -> None:
    from trainguard.events.registry import BY_NAME
    from trainguard.incidents.aggregate import FOLDED_TYPES
    from trainguard.incidents.service import INPUT_ROLES

    assert {BY_NAME[t].topic for t in FOLDED_TYPES} <= set(INPUT_ROLES)
    assert "job.ended" in FOLDED_TYPES
