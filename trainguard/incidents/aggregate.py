"""The incident fold: one job's events, in (event_time, event_id) order, in; transitions out.

Pure and deterministic: no clock, no I/O, ids derived from the inputs. The rules (when an
incident opens, what joins it, when it moves) are documented in docs/incidents.md; the code
follows that text section by section.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainguard.events.codec import make_event, type_of_payload
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    Command,
    CommandAction,
    CommandOutcome,
    IncidentState,
    IncidentTransition,
    JobEnded,
    OutcomeStatus,
    Payload,
    PoolUnit,
    Severity,
    StepReport,
    UnitState,
    Verdict,
    VerdictState,
)
from trainguard.incidents.model import (
    TIER_ACTIONS,
    BindingRef,
    CommandRef,
    FenceRef,
    Incident,
    LoadRef,
    OutcomeRef,
    StepRef,
    VerdictRef,
    order_key,
)
from trainguard.incidents.recovery import recovery_evidence
from trainguard.incidents.settings import SEVERITY_RANK, SOURCE, IncidentSettings

S = IncidentState
# what the fold reads (``apply``); every other event leaves the books as they are
FOLDED: tuple[type[Payload], ...] = (Verdict, Command, CommandOutcome, PoolUnit, CheckpointEvent,
                                     StepReport, JobEnded)
FOLDED_TYPES = frozenset(type_of_payload(model).name for model in FOLDED)
FAILED_STATUSES = frozenset({OutcomeStatus.FAILED, OutcomeStatus.TIMED_OUT,
                             OutcomeStatus.REFUSED})


def incident_id(job_id: str, opening_verdict_id: str) -> str:
    return derived_id("incident", job_id, opening_verdict_id)


def transition_id(inc_id: str, seq: int) -> str:
    return derived_id("incident.transition", inc_id, seq)


def is_located(subject: Subject) -> bool:
    return any(v is not None for v in (subject.node, subject.rank, subject.gpu, subject.link,
                                       subject.unit))


class IncidentBook:
    """Every incident of one job. ``apply`` takes the job's next event (time order) and
    returns the transition events it caused."""

    def __init__(self, job_id: str, settings: IncidentSettings | None = None) -> None:
        self.job_id = job_id
        self.settings = settings or IncidentSettings()
        self.incidents: dict[str, Incident] = {}  # insertion order = opening order
        self._by_verdict: dict[str, str] = {}
        self._by_command: dict[str, str] = {}
        self._seen: set[str] = set()
        self.ended: Event | None = None  # the scheduler's end of the job (``job.ended``)

    # -- entry ------------------------------------------------------------------------------

    def apply(self, event: Event) -> list[Event]:
        if event.job_id != self.job_id or event.type not in FOLDED_TYPES:
            return []
        p = event.payload
        if isinstance(p, StepReport):  # many, and a repeated one is harmless: not remembered
            return self._step(event, p)
        if event.event_id in self._seen:
            return []
        self._seen.add(event.event_id)
        if isinstance(p, Verdict):
            return self._verdict(event, p)
        if isinstance(p, Command):
            return self._command(event, p)
        if isinstance(p, CommandOutcome):
            return self._outcome(event, p)
        if isinstance(p, PoolUnit):
            return self._pool(event, p)
        if isinstance(p, CheckpointEvent):
            return self._checkpoint(event, p)
        if isinstance(p, JobEnded):
            return self._job_ended(event, p)
        return []

    def active(self) -> list[Incident]:
        return [i for i in self.incidents.values() if not i.terminal]

    # -- verdicts ---------------------------------------------------------------------------

    def _verdict(self, event: Event, v: Verdict) -> list[Event]:
        if v.state is VerdictState.RESOLVED:
            inc = self._incident_of_verdict(v.verdict_id)
            if inc is None:
                return []
            ref = inc.verdicts[v.verdict_id]
            if ref.resolved_time is None:
                ref.resolved_time = event.event_time
                ref.resolved_event_id = event.event_id
            inc.last_time = event.event_time
            return self._settle(inc, event)
        if v.verdict_id in self._by_verdict:
            return []
        home = self._home_for(event.subject, event.event_time, v.severity)
        if home is None:
            if self.ended is not None:
                return []  # the ended job's last echoes (its ranks' exits): no new incident
            if SEVERITY_RANK[v.severity] < SEVERITY_RANK[self.settings.open_severity]:
                return []
            return self._open(event, v)
        self._add_verdict(home, event, v)
        out: list[Event] = []
        if home.state is S.DETECTED and is_located(event.subject):
            out += self._move(home, S.LOCATED, event, f"located: {v.kind} at {_where(event)}")
        return out

    def _home_for(self, subject: Subject, t: int, severity: Severity) -> Incident | None:
        """The active incident a new verdict joins, most recently opened first."""
        for inc in reversed(self.active()):
            opening = SEVERITY_RANK[inc.opening_severity]
            if subject.rank is not None and subject.rank in inc.ranks:
                return inc
            if subject.rank is None and subject.node is not None and subject.node in inc.nodes:
                return inc
            if not is_located(subject) or inc.disrupted:
                return inc
            # a symptom is never more severe than its cause: a worse verdict is a new fault
            if t - inc.opened_at <= self.settings.join_window_us and \
                    SEVERITY_RANK[severity] <= opening:
                return inc
        return None

    def _open(self, event: Event, v: Verdict) -> list[Event]:
        inc = Incident(incident_id(self.job_id, v.verdict_id), self.job_id, event.subject,
                       opened_at=event.event_time, last_time=event.event_time)
        self.incidents[inc.incident_id] = inc
        self._add_verdict(inc, event, v)
        out = self._move(inc, S.DETECTED, event, f"{v.severity.value} {v.kind} verdict opened")
        if is_located(event.subject):
            out += self._move(inc, S.LOCATED, event, f"located: {v.kind} at {_where(event)}")
        return out

    def _add_verdict(self, inc: Incident, event: Event, v: Verdict) -> None:
        inc.verdicts[v.verdict_id] = VerdictRef(
            v.verdict_id, v.rule, v.kind, v.severity, event.subject, v.first_anomalous_time,
            event.event_time, event.event_id, dict(v.evidence))
        inc.last_time = event.event_time
        self._by_verdict[v.verdict_id] = inc.incident_id

    def _relocate(self, inc: Incident) -> None:
        """Located at the rank the decision moved as failed: exits seen in one instant (a
        rank and the peers its death took down) open verdicts in event-id order, and the
        first of them need not be the cause."""
        causes = inc.cause_ranks()
        if not causes or inc.subject.rank in causes:
            return
        for ref in sorted(inc.verdicts.values(), key=lambda v: (v.opened_time, v.verdict_id)):
            if ref.subject.rank in causes:
                inc.subject = ref.subject
                return

    def _incident_of_verdict(self, verdict_id: str) -> Incident | None:
        iid = self._by_verdict.get(verdict_id)
        return None if iid is None else self.incidents[iid]

    # -- decisions and their outcomes -------------------------------------------------------

    def _command(self, event: Event, c: Command) -> list[Event]:
        inc = None
        for vid in c.cause_verdict_ids:
            inc = self._incident_of_verdict(vid)
            if inc is not None:
                break
        if inc is None:
            inc = self._incident_for_command(event, c)
        if inc is None or c.command_id in self._by_command:
            return []
        ref = CommandRef(c.command_id, c.action, c.tier, event.event_time, event.event_id,
                         event.subject, c.params)
        inc.commands[c.command_id] = ref
        self._by_command[c.command_id] = inc.incident_id
        inc.last_time = event.event_time
        self._relocate(inc)
        if inc.terminal:
            return []
        if c.action is CommandAction.ESCALATE:
            if inc.state is S.ESCALATED:
                return []
            why = c.params.reason or "tiers exhausted"
            return self._move(inc, S.ESCALATED, event, f"escalated to a human: {why}")
        if c.action not in TIER_ACTIONS:
            return []
        if ref in inc.heavy_commands():
            inc.progress.clear()  # recovery evidence must come after this command
            inc.after_load = None
        if inc.state is S.MITIGATING and inc.tier == c.tier:
            return []
        return self._move(inc, S.MITIGATING, event, f"tier {c.tier}: {c.action.value}",
                          tier=c.tier)

    def _incident_for_command(self, event: Event, c: Command) -> Incident | None:
        """A command naming no verdict of an incident (an escalation after a failed command,
        a restart-storm stop): the incident that holds its rank, else the latest one already
        acting. Incidents closed within the join window still take it (it is their tail)."""
        rank = event.subject.rank
        if rank is None:
            rank = c.params.rank
        t = event.event_time
        candidates = [i for i in self.incidents.values() if i.commands and (
            not i.terminal or (i.closed_at is not None
                               and t - i.closed_at <= self.settings.join_window_us))]
        for inc in reversed(candidates):
            if rank is not None and rank in inc.ranks:
                return inc
        return candidates[-1] if candidates and rank is None else None

    def _outcome(self, event: Event, o: CommandOutcome) -> list[Event]:
        iid = self._by_command.get(o.command_id)
        if iid is None:
            return []
        inc = self.incidents[iid]
        ref = inc.commands[o.command_id]
        ref.outcomes.append(OutcomeRef(o.status, event.event_time, event.event_id, o.detail))
        inc.last_time = event.event_time
        if inc.terminal:
            return []
        if (ref.action is CommandAction.RESUME and o.status in FAILED_STATUSES
                and o.retry is None):  # a retryable refusal: the policy retries
            return self._move(inc, S.UNRECOVERABLE, event,
                              f"resume {o.status.value}: {o.detail or 'no detail'}")
        return self._settle(inc, event)

    def _job_ended(self, event: Event, e: JobEnded) -> list[Event]:
        """The scheduler ended the job: every incident still open ends with it, ``ended`` when
        it was ended on purpose, ``unrecoverable`` when the allocation itself failed."""
        if self.ended is not None:
            return []
        self.ended = event
        said = e.state + (f" ({e.reason})" if e.reason else "")
        if e.end.deliberate:
            to, why = S.ENDED, (f"the scheduler ended the job: {said}, allocation "
                                f"{e.allocation}; nothing to recover")
        else:
            to, why = S.UNRECOVERABLE, (
                f"the job's allocation {e.allocation} ended {said}: trainguard cannot restart "
                "the job without one; resubmit it (it resumes from its last valid checkpoint)")
        out: list[Event] = []
        for inc in self.active():
            inc.last_time = event.event_time
            out += self._move(inc, to, event, why)
        return out

    # -- resources, checkpoints, progress ---------------------------------------------------

    def _pool(self, event: Event, u: PoolUnit) -> list[Event]:
        inc = self._incident_for_resource(u.command_id, u.rank)
        if inc is None:
            return []
        if u.state is UnitState.BOUND:
            inc.bindings.append(BindingRef(u.unit, u.node, u.rank, u.epoch, u.pid,
                                           event.event_time, event.event_id, u.command_id))
        elif u.state in (UnitState.FENCED, UnitState.FAILED):
            inc.fences.append(FenceRef(u.unit, u.node, u.rank, u.pid, event.event_time,
                                       event.event_id, list(u.released)))
        else:
            return []
        inc.last_time = event.event_time
        return self._settle(inc, event)

    def _incident_for_resource(self, command_id: str | None, rank: int | None) -> Incident | None:
        if command_id is not None and command_id in self._by_command:
            inc = self.incidents[self._by_command[command_id]]
            return None if inc.terminal else inc
        for inc in reversed(self.active()):
            if inc.disrupted and (rank is None or rank in inc.ranks):
                return inc
        return None

    def _checkpoint(self, event: Event, c: CheckpointEvent) -> list[Event]:
        if c.action is not CheckpointAction.LOADED:
            return []
        out: list[Event] = []
        for inc in self.active():
            if inc.disrupted:
                inc.loads.append(LoadRef(c.step, c.samples_consumed, c.path, event.event_time,
                                         event.event_id))
                inc.after_load = None  # the evidence is the first step after the last load
                inc.last_time = event.event_time
                out += self._settle(inc, event)
        return out

    def _step(self, event: Event, r: StepReport) -> list[Event]:
        out: list[Event] = []
        key = (r.rank, r.binding_epoch)
        for inc in self.active():
            if not inc.disrupted:
                continue
            ref = StepRef(r.rank, r.binding_epoch, r.step, r.samples_consumed, event.event_time,
                          event.event_id, r.pid)
            fresh = key not in inc.progress
            if fresh:
                inc.progress[key] = ref
            if inc.loads and inc.after_load is None:
                inc.after_load = ref
                fresh = True
            if fresh:
                out += self._settle(inc, event)
        return out

    # -- moves ------------------------------------------------------------------------------

    def _settle(self, inc: Incident, cause: Event) -> list[Event]:
        """Move to recovered when the evidence in docs/incidents.md is all there."""
        if inc.terminal:
            return []
        ok, why, causes = recovery_evidence(inc)
        if not ok:
            return []
        return self._move(inc, S.RECOVERED, cause, why, extra_causes=causes)

    def _move(self, inc: Incident, to: IncidentState, cause: Event, reason: str,
              tier: int | None = None, extra_causes: Iterable[str] = ()) -> list[Event]:
        tier = inc.tier if tier is None else tier
        causes = [cause.event_id, *[c for c in extra_causes if c != cause.event_id]]
        opening = next(iter(inc.verdicts.values()), None)
        payload = IncidentTransition(incident_id=inc.incident_id, seq=len(inc.transitions),
                                     from_state=inc.state, to_state=to, reason=reason,
                                     tier=tier, cause_event_ids=causes,
                                     severity=None if opening is None else opening.severity,
                                     verdict_kind=None if opening is None else opening.kind)
        ev = make_event(payload, event_id=transition_id(inc.incident_id, payload.seq),
                        job_id=inc.job_id, event_time=cause.event_time, source=SOURCE,
                        subject=inc.subject)
        inc.transitions.append(ev)
        inc.state, inc.tier = to, tier
        if to.terminal:
            inc.closed_at = cause.event_time
        return [ev]


def _where(event: Event) -> str:
    return ", ".join(f"{k} {v}" for k, v in event.subject.model_dump(exclude_none=True).items())


def rebuild_incidents(events: Iterable[Event], settings: IncidentSettings | None = None
                      ) -> dict[str, IncidentBook]:
    """The whole log, any order, duplicates allowed -> every job's book."""
    books: dict[str, IncidentBook] = {}
    for ev in sorted({e.event_id: e for e in events if e.type in FOLDED_TYPES}.values(),
                     key=order_key):
        book = books.get(ev.job_id)
        if book is None:
            book = books[ev.job_id] = IncidentBook(ev.job_id, settings)
        book.apply(ev)
    return books


def rebuild(events: Iterable[Event], settings: IncidentSettings | None = None) -> list[Event]:
    """The transition events the log implies, in (event_time, event_id) order."""
    out = [t for book in rebuild_incidents(events, settings).values()
           for inc in book.incidents.values() for t in inc.transitions]
    return sorted(out, key=transition_order)


def transition_order(event: Event) -> tuple[int, str, str, int]:
    """Time, then job, incident and seq: an incident's same-instant moves stay in order."""
    p = event.payload
    assert isinstance(p, IncidentTransition)
    return (event.event_time, event.job_id, p.incident_id, p.seq)
