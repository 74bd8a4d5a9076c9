"""Storms into a handful of notices: pure, time passed in.

Per incident the coalescer keeps what has been announced (a ``Phase``) and what the latest
transition says should be (the desired phase). A notice is due once the two have differed for
``hold_s``: every transition inside that hold folds into one notice carrying the latest state,
so an incident that goes detected -> located -> mitigating -> ... in a second is announced once
as opened (and once as recovered), however many transitions it had.

An incident first seen with a ``from_state`` (its earlier transitions were read before this
process started, e.g. after a restart at a committed offset) is taken as announced up to that
state: the service commits offsets only once everything read has been delivered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from trainguard.alerts.model import (
    END_PHASES,
    FIRING_KINDS,
    Notice,
    NoticeKind,
    Phase,
    Transition,
    phase_of,
)
from trainguard.events.payloads import Severity, VerdictKind

_END_KIND = {phase: NoticeKind(phase.value) for phase in END_PHASES}


def plan(announced: Phase, desired: Phase) -> tuple[NoticeKind, ...]:
    """The notices that take an incident from what was announced to what should be."""
    if announced == desired:
        return ()
    if desired == Phase.OPEN:
        return (NoticeKind.OPENED,) if announced == Phase.NONE else (NoticeKind.REOPENED,)
    if desired == Phase.ENDED and announced == Phase.NONE:
        return ()  # the scheduler ended the job before anyone was told: nothing to tell
    end = _END_KIND[desired]
    return (NoticeKind.OPENED, end) if announced == Phase.NONE else (end,)


@dataclass
class _Incident:
    first: Transition
    latest: Transition
    announced: Phase
    desired: Phase
    dirty_since: float | None
    touched: float
    transitions: int = 1
    last_kind: NoticeKind | None = None
    reason: str = ""
    tier: int | None = None
    node: str | None = None
    rank: int | None = None
    severity: Severity | None = None
    verdict_kind: VerdictKind | None = None

    def fold(self, t: Transition) -> None:
        self.latest = t
        self.transitions += 1
        self.reason = t.reason or self.reason
        self.tier = t.tier if t.tier is not None else self.tier
        self.node = t.node or self.node
        self.rank = t.rank if t.rank is not None else self.rank
        self.severity = self.severity or t.severity
        self.verdict_kind = self.verdict_kind or t.verdict_kind

    def notice(self, kind: NoticeKind) -> Notice:
        return Notice(kind=kind, incident_id=self.first.incident_id, job_id=self.first.job_id,
                      state=self.latest.to_state, opened_at_us=self.first.event_time_us,
                      at_us=self.latest.event_time_us, transitions=self.transitions,
                      reason=self.reason, tier=self.tier, node=self.node, rank=self.rank,
                      severity=self.severity, verdict_kind=self.verdict_kind,
                      first_node=self.first.node, first_rank=self.first.rank)


@dataclass
class CoalescerStats:
    transitions: int = 0
    duplicates: int = 0
    notices: int = 0
    forgotten: int = 0


class Coalescer:
    def __init__(self, hold_s: float = 2.0, retain_s: float = 86_400.0) -> None:
        if hold_s < 0 or retain_s < 0:
            raise ValueError("hold_s and retain_s must be >= 0")
        self.hold_s = hold_s
        self.retain_s = retain_s
        self.stats = CoalescerStats()
        self._incidents: dict[str, _Incident] = {}

    def offer(self, t: Transition, now: float) -> None:
        self.stats.transitions += 1
        inc = self._incidents.get(t.incident_id)
        if inc is None:
            announced = Phase.NONE if t.from_state is None else phase_of(t.from_state)
            inc = _Incident(first=t, latest=t, announced=announced, desired=announced,
                            dirty_since=None, touched=now, reason=t.reason, tier=t.tier,
                            node=t.node, rank=t.rank, severity=t.severity,
                            verdict_kind=t.verdict_kind)
            if announced != Phase.NONE:
                inc.last_kind = plan(Phase.NONE, announced)[-1]
            self._incidents[t.incident_id] = inc
        elif t.seq <= inc.latest.seq:
            self.stats.duplicates += 1  # redelivered or out of order: the latest stands
            return
        else:
            inc.fold(t)
        inc.touched = now
        inc.desired = phase_of(t.to_state)
        if inc.desired == inc.announced:
            inc.dirty_since = None
        elif inc.dirty_since is None:
            inc.dirty_since = now

    def due(self, now: float) -> list[Notice]:
        """Notices whose hold has passed, oldest incident first; forgets long-closed ones."""
        out: list[Notice] = []
        for inc in self._incidents.values():
            if inc.dirty_since is None or now < inc.dirty_since + self.hold_s:
                continue
            kinds = plan(inc.announced, inc.desired)
            out.extend(inc.notice(k) for k in kinds)
            if kinds:  # an incident never told stays untold: told later, it opens first
                inc.announced = inc.desired
            inc.dirty_since = None
            inc.last_kind = kinds[-1] if kinds else inc.last_kind
        self._forget(now)
        self.stats.notices += len(out)
        out.sort(key=lambda n: (n.opened_at_us, n.incident_id))
        return out

    def flush_all(self) -> list[Notice]:
        """Everything pending, now (on shutdown)."""
        return self.due(math.inf) if self.pending() else []

    def pending(self) -> bool:
        return any(inc.dirty_since is not None for inc in self._incidents.values())

    def firing(self) -> list[Notice]:
        """Incidents announced and not recovered, as last announced (for periodic re-sends)."""
        out: list[Notice] = []
        for inc in self._incidents.values():
            kind = inc.last_kind
            if kind is not None and kind in FIRING_KINDS and inc.announced != Phase.RECOVERED:
                out.append(replace(inc.notice(kind), refresh=True))
        out.sort(key=lambda n: (n.opened_at_us, n.incident_id))
        return out

    def known(self) -> int:
        return len(self._incidents)

    def _forget(self, now: float) -> None:
        stale = [key for key, inc in self._incidents.items()
                 if inc.dirty_since is None and inc.desired in END_PHASES
                 and now - inc.touched >= self.retain_s]
        for key in stale:
            del self._incidents[key]
        self.stats.forgotten += len(stale)
