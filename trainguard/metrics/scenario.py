"""A scripted fault episode as contract events: for tests (every metric and every dashboard
panel gets data from it), the docs and trying dashboards out.

One episode of a 4-rank job: steps; a checkpoint written and verified; rank 2 turns straggler
(verdict with evidence ratio); incident A detected -> located -> mitigating (tier 1, quota
raised, done) -> recovered; rank 3 exits (critical verdict); incident B detected -> located ->
mitigating (tier 2 migrate: failed; tier 3 resume: done) -> recovered; an XID on rank 0:
incident C mitigating (tier 3 resume: failed) -> escalated to a human; and, with ``leave_open``,
incident D detected and located but not yet mitigated, its straggler verdict still open.
Several events share one event time, as they do in a real log.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainguard.events import payloads as p
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id

S = 1_000_000
INGEST_DELAY_US = 40_000


@dataclass
class _Log:
    job_id: str
    tag: str
    events: list[Event] = field(default_factory=list)

    def add(self, payload: p.Payload, t: int, subject: Subject, source: str) -> Event:
        ev = make_event(payload, event_id=derived_id("scenario", self.job_id, self.tag,
                                                     len(self.events)),
                        job_id=self.job_id, event_time=t, source=source, subject=subject,
                        ingest_time=t + INGEST_DELAY_US)
        self.events.append(ev)
        return ev


def episode(job_id: str, t0: int, tag: str = "a", *, leave_open: bool = False,
            ranks: int = 4, steps: int = 12) -> list[Event]:
    log = _Log(job_id, tag)
    node = "node-a"
    for step in range(steps):
        for rank in range(ranks):
            slow = rank == 2 and 4 <= step < 8
            log.add(p.StepReport(rank=rank, world_size=ranks, step=step,
                                 samples_consumed=(step + 1) * 32, compute_ms=400.0 if slow
                                 else 100.0 + rank, step_ms=420.0 if slow else 120.0),
                    t0 + step * S, Subject(node=node, rank=rank), f"sdk@{node}")
        if step == 3:
            for action in (p.CheckpointAction.WRITTEN, p.CheckpointAction.VERIFIED):
                log.add(p.CheckpointEvent(action=action, step=step, samples_consumed=128,
                                          path=f"/ckpt/{job_id}/step-{step}"),
                        t0 + step * S + 500_000, Subject(rank=0), f"sdk@{node}")
    _incident(log, t0, p.VerdictKind.STRAGGLER, 2, "warning", {"ratio": 4.0}, tiers=[
        (1, p.CommandAction.RAISE_QUOTA, [p.OutcomeStatus.ACCEPTED, p.OutcomeStatus.DONE])],
        at=5, recover_at=9)
    log.add(p.ProcessExit(pid=4243, rank=3, signal=9, detected_by="pidfd"), t0 + 9 * S,
            Subject(node=node, rank=3), f"agent@{node}")
    _incident(log, t0, p.VerdictKind.PROCESS_EXIT, 3, "critical", {"signal": 9}, tiers=[
        (2, p.CommandAction.MIGRATE, [p.OutcomeStatus.ACCEPTED, p.OutcomeStatus.FAILED]),
        (3, p.CommandAction.RESUME, [p.OutcomeStatus.ACCEPTED, p.OutcomeStatus.DONE])],
        at=9, recover_at=11)
    _incident(log, t0, p.VerdictKind.XID_DRAIN, 0, "critical", {"xid": 79}, tiers=[
        (3, p.CommandAction.RESUME, [p.OutcomeStatus.ACCEPTED, p.OutcomeStatus.FAILED]),
        (0, p.CommandAction.ESCALATE, [p.OutcomeStatus.DONE])],
        at=7, recover_at=10, end=p.IncidentState.ESCALATED)
    if leave_open:
        _incident(log, t0, p.VerdictKind.STRAGGLER, 1, "warning", {"ratio": 2.5}, tiers=[], at=10,
                  recover_at=None)
    return log.events


def _incident(log: _Log, t0: int, kind: p.VerdictKind, rank: int, severity: str,
              evidence: dict[str, float | int], *,
              tiers: list[tuple[int, p.CommandAction, list[p.OutcomeStatus]]], at: int,
              recover_at: int | None,
              end: p.IncidentState = p.IncidentState.RECOVERED) -> str:
    t = t0 + at * S
    subject = Subject(node="node-a", rank=rank)
    verdict_id = derived_id("verdict", log.job_id, log.tag, kind, rank)
    opened = log.add(p.Verdict(verdict_id=verdict_id, rule=kind, kind=kind,
                               state=p.VerdictState.OPEN, severity=p.Severity(severity),
                               first_anomalous_time=t - S, decided_time=t, evidence=evidence),
                     t, subject, "streams")
    iid = derived_id("incident", log.job_id, log.tag, kind, rank)
    seq = 0
    state: p.IncidentState | None = None

    def move(to: p.IncidentState, when: int, tier: int | None = None, reason: str = "",
             causes: list[str] | None = None) -> None:
        nonlocal seq, state
        log.add(p.IncidentTransition(incident_id=iid, seq=seq, from_state=state, to_state=to,
                                     tier=tier, reason=reason, cause_event_ids=causes or []),
                when, subject, "incidents")
        seq, state = seq + 1, to

    move(p.IncidentState.DETECTED, t, reason=f"{kind} verdict", causes=[opened.event_id])
    move(p.IncidentState.LOCATED, t + 200_000, reason=f"rank {rank} on node-a")
    when = t + 200_000
    cited: list[str] = []  # each command and its last outcome, which the end cites
    for tier, action, statuses in tiers:
        when += 300_000
        cid = derived_id("command", iid, tier)
        params = {"rank": rank, "ranks": [rank]} if action is p.CommandAction.MIGRATE else {
            "rank": rank}
        command = log.add(p.Command(command_id=cid, idempotency_key=cid, action=action,
                                    tier=tier, issued_at=when, issued_by="decider",
                                    cause_verdict_ids=[verdict_id], params=params),
                          when, subject, "decider")
        if action is not p.CommandAction.ESCALATE:  # as the aggregate does: it cites the command
            move(p.IncidentState.MITIGATING, when, tier=tier, reason=action.value,
                 causes=[command.event_id])
        cited.append(command.event_id)
        for i, status in enumerate(statuses, 1):
            when += 250_000
            outcome = log.add(p.CommandOutcome(command_id=cid, idempotency_key=cid,
                                               action=action, status=status, started_at=when,
                                               finished_at=when, detail=status.value),
                              when, subject, "actuator")
            if i == len(statuses):
                cited.append(outcome.event_id)
    if recover_at is None:
        return iid
    end_at = max(t0 + recover_at * S, when + 100_000)
    if end is p.IncidentState.RECOVERED:
        log.add(p.Verdict(verdict_id=verdict_id, rule=kind, kind=kind,
                          state=p.VerdictState.RESOLVED, severity=p.Severity(severity),
                          first_anomalous_time=t - S, decided_time=end_at, evidence=evidence),
                end_at, subject, "streams")
    move(end, end_at, reason="progress continued" if end is p.IncidentState.RECOVERED
         else "tiers exhausted", causes=cited)
    return iid
