"""What the alerts service knows about an incident, and the notices it announces.

A ``Transition`` is the part of an ``incident.transition`` event the alerts need. A ``Notice``
is one thing worth telling people about one incident: it opened, it reopened, it recovered, it
was escalated to a human, or it was declared unrecoverable.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.compat import StrEnum
from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentState, IncidentTransition, Severity, VerdictKind


class Phase(StrEnum):
    """What has been (or should be) announced about an incident."""

    NONE = "none"
    OPEN = "open"
    RECOVERED = "recovered"
    ESCALATED = "escalated"
    UNRECOVERABLE = "unrecoverable"
    ENDED = "ended"


class NoticeKind(StrEnum):
    OPENED = "opened"
    REOPENED = "reopened"
    RECOVERED = "recovered"
    ESCALATED = "escalated"
    UNRECOVERABLE = "unrecoverable"
    ENDED = "ended"  # the scheduler ended the job: told, never firing


# every incident state past the active ones, by name
END_PHASES = frozenset(Phase(s.value) for s in IncidentState if not s.active)
# Still a problem for a human: Alertmanager keeps these firing.
FIRING_KINDS = frozenset({NoticeKind.OPENED, NoticeKind.REOPENED, NoticeKind.ESCALATED,
                          NoticeKind.UNRECOVERABLE})


def phase_of(state: IncidentState) -> Phase:
    if state.active:
        return Phase.OPEN
    return Phase(state.value)


@dataclass(frozen=True)
class Transition:
    incident_id: str
    job_id: str
    seq: int
    from_state: IncidentState | None
    to_state: IncidentState
    event_time_us: int
    reason: str = ""
    tier: int | None = None
    node: str | None = None
    rank: int | None = None
    severity: Severity | None = None
    verdict_kind: VerdictKind | None = None


def transition_from_event(event: Event) -> Transition | None:
    """The transition an event carries, or None for any other event type."""
    payload = event.payload
    if not isinstance(payload, IncidentTransition):
        return None
    return Transition(
        incident_id=payload.incident_id, job_id=event.job_id, seq=payload.seq,
        from_state=payload.from_state, to_state=payload.to_state,
        event_time_us=event.event_time, reason=payload.reason, tier=payload.tier,
        node=event.subject.node, rank=event.subject.rank, severity=payload.severity,
        verdict_kind=payload.verdict_kind)


def short_ref(incident_id: str) -> str:
    """The human handle of an incident, the same in every message about it."""
    return "INC-" + (incident_id if len(incident_id) <= 12 else incident_id[:12])


def thread_key(job_id: str, incident_id: str) -> str:
    """The stable key of an incident's thread on every channel (see docs/alerts.md)."""
    return f"trainguard/{job_id}/{incident_id}"


@dataclass(frozen=True)
class Notice:
    kind: NoticeKind
    incident_id: str
    job_id: str
    state: IncidentState
    opened_at_us: int
    at_us: int
    transitions: int
    reason: str = ""
    tier: int | None = None
    node: str | None = None
    rank: int | None = None
    severity: Severity | None = None  # the opening verdict's (None in logs older than the field)
    verdict_kind: VerdictKind | None = None
    # where the incident was when first seen: Alertmanager's node/rank labels, which must not
    # change while the alert fires (a relocation would make it a second alert)
    first_node: str | None = None
    first_rank: int | None = None
    refresh: bool = False  # repeats what was announced (Alertmanager's periodic re-send)

    @property
    def ref(self) -> str:
        return short_ref(self.incident_id)

    @property
    def thread_key(self) -> str:
        return thread_key(self.job_id, self.incident_id)
