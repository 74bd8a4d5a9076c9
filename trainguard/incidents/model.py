"""What an incident holds: the verdicts, commands, bindings, fences, loads and progress that
joined it, and the transitions it went through. Plain data; the fold is in ``aggregate.py``."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import (
    ActionParams,
    CommandAction,
    EscalateParams,
    IncidentState,
    MigrateParams,
    OutcomeStatus,
    Severity,
    VerdictKind,
)

TERMINAL = frozenset(s for s in IncidentState if s.terminal)
HEAVY_ACTIONS = frozenset({CommandAction.MIGRATE, CommandAction.RESUME})


def order_key(event: Event) -> tuple[int, str]:
    """The log's one order: event time, then event id (ties broken the same on every replay)."""
    return (event.event_time, event.event_id)
TIER_ACTIONS = frozenset({CommandAction.RAISE_QUOTA, CommandAction.MIGRATE, CommandAction.RESUME})
FINAL_STATUSES = frozenset({OutcomeStatus.DONE, OutcomeStatus.FAILED, OutcomeStatus.TIMED_OUT,
                            OutcomeStatus.REFUSED})


@dataclass
class VerdictRef:
    verdict_id: str
    rule: str
    kind: VerdictKind
    severity: Severity
    subject: Subject
    first_time: int
    opened_time: int
    open_event_id: str
    evidence: dict[str, object] = field(default_factory=dict)
    resolved_time: int | None = None
    resolved_event_id: str | None = None


@dataclass
class OutcomeRef:
    status: OutcomeStatus
    time: int
    event_id: str
    detail: str = ""


@dataclass
class CommandRef:
    command_id: str
    action: CommandAction
    tier: int
    issued_time: int
    event_id: str
    subject: Subject
    params: ActionParams = field(default_factory=EscalateParams)
    outcomes: list[OutcomeRef] = field(default_factory=list)

    @property
    def final(self) -> OutcomeRef | None:
        for out in self.outcomes:
            if out.status in FINAL_STATUSES:
                return out
        return None


@dataclass
class BindingRef:
    unit: str
    node: str | None
    rank: int | None
    epoch: int | None
    pid: int | None
    time: int
    event_id: str
    command_id: str | None


@dataclass
class FenceRef:
    unit: str
    node: str | None
    rank: int | None
    pid: int | None
    time: int
    event_id: str
    released: list[str] = field(default_factory=list)


@dataclass
class LoadRef:
    step: int
    samples_consumed: int
    path: str
    time: int
    event_id: str


@dataclass
class StepRef:
    rank: int
    epoch: int
    step: int
    samples_consumed: int
    time: int
    event_id: str
    pid: int | None = None


@dataclass
class Incident:
    incident_id: str
    job_id: str
    subject: Subject
    opened_at: int
    state: IncidentState | None = None
    tier: int | None = None
    verdicts: dict[str, VerdictRef] = field(default_factory=dict)
    commands: dict[str, CommandRef] = field(default_factory=dict)
    bindings: list[BindingRef] = field(default_factory=list)
    fences: list[FenceRef] = field(default_factory=list)
    loads: list[LoadRef] = field(default_factory=list)
    # first step report per (rank, epoch) since the latest migrate/resume command
    progress: dict[tuple[int, int], StepRef] = field(default_factory=dict)
    after_load: StepRef | None = None  # the first step report after the latest load
    transitions: list[Event] = field(default_factory=list)
    closed_at: int | None = None
    last_time: int = 0

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def opening_severity(self) -> Severity:
        return next(iter(self.verdicts.values())).severity

    @property
    def ranks(self) -> set[int]:
        return {v.subject.rank for v in self.verdicts.values() if v.subject.rank is not None}

    @property
    def nodes(self) -> set[str]:
        return {v.subject.node for v in self.verdicts.values() if v.subject.node is not None}

    def heavy_commands(self) -> list[CommandRef]:
        return sorted((c for c in self.commands.values() if c.action in HEAVY_ACTIONS),
                      key=lambda c: (c.issued_time, c.command_id))

    def cause_ranks(self) -> set[int]:
        """The ranks the decision service moved as failed (a migrate's rank or ranks): when a
        rank's death takes its synchronous peers with it in the same instant, the verdicts
        alone do not say which one failed first; the decision does."""
        out: set[int] = set()
        for c in self.heavy_commands():
            if c.subject.rank is not None:
                out.add(c.subject.rank)
            if isinstance(c.params, MigrateParams):
                out |= set(c.params.ranks)
        return out

    @property
    def disrupted(self) -> bool:
        """A migration or resume is under way: the job's other symptoms belong here."""
        return not self.terminal and bool(self.heavy_commands())
