"""From a pile of events to one record per incident: its transitions, verdicts and commands.

Deterministic whatever the input order: events are deduplicated by event id (transitions also by
``(incident_id, seq)``, commands by ``command_id``) and sorted by ``(event_time, type,
event_id)`` before anything is decided.

A command belongs to an incident when the incident's transitions cite it (its event id or
command id, or an outcome's event id), or cite a verdict the command was issued for. A command
no incident cites goes to the incident of its job that was detected last at or before it and
had not ended by then, unless it names the verdicts it was issued for: then it belongs to the
incident that cites one of them or to none, for a live reader may not have read that incident's
transitions yet, and the window would hand the command to another open incident of the job.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from trainguard.events.envelope import Event
from trainguard.events.payloads import (
    Command,
    CommandOutcome,
    IncidentState,
    IncidentTransition,
    Verdict,
)

END_STATES = frozenset(s for s in IncidentState if not s.active)


@dataclass(frozen=True)
class CommandRecord:
    event: Event
    command: Command
    outcomes: tuple[tuple[Event, CommandOutcome], ...]


@dataclass
class IncidentRecord:
    incident_id: str
    job_id: str
    transitions: list[tuple[Event, IncidentTransition]] = field(default_factory=list)
    verdicts: list[tuple[Event, Verdict]] = field(default_factory=list)
    commands: list[CommandRecord] = field(default_factory=list)

    @property
    def start_us(self) -> int:
        return self.transitions[0][0].event_time

    @property
    def end(self) -> tuple[Event, IncidentTransition] | None:
        return next(((e, t) for e, t in self.transitions if t.to_state in END_STATES), None)

    def cited(self) -> set[str]:
        return {c for _e, t in self.transitions for c in t.cause_event_ids}


def ordered(events: Iterable[Event]) -> list[Event]:
    unique = {e.event_id: e for e in sorted(events, key=lambda e: e.event_id)}
    return sorted(unique.values(), key=lambda e: (e.event_time, e.type, e.event_id))


def gather(events: Iterable[Event]) -> list[IncidentRecord]:
    """Every incident found in the events, by incident id."""
    evs = ordered(events)
    incidents = _incidents(evs)
    verdicts = {e.event_id: (e, e.payload) for e in evs if isinstance(e.payload, Verdict)}
    for inc in incidents:
        inc.verdicts = [verdicts[c] for c in sorted(inc.cited()) if c in verdicts]
    for rec in _commands(evs):
        owner = _explicit_owner(rec, incidents)
        if owner is None and not rec.command.cause_verdict_ids:
            owner = _window_owner(rec, incidents)
        if owner is not None:
            owner.commands.append(rec)
    return incidents


def _incidents(evs: list[Event]) -> list[IncidentRecord]:
    by_id: dict[str, IncidentRecord] = {}
    seen: set[tuple[str, int]] = set()
    for e in evs:
        t = e.payload
        if not isinstance(t, IncidentTransition) or (t.incident_id, t.seq) in seen:
            continue
        seen.add((t.incident_id, t.seq))
        inc = by_id.setdefault(t.incident_id, IncidentRecord(t.incident_id, e.job_id))
        inc.transitions.append((e, t))
    for inc in by_id.values():
        inc.transitions.sort(key=lambda et: (et[1].seq, et[0].event_time))
    return [by_id[k] for k in sorted(by_id)]


def _commands(evs: list[Event]) -> list[CommandRecord]:
    firsts: dict[str, tuple[Event, Command]] = {}
    outcomes: dict[str, list[tuple[Event, CommandOutcome]]] = {}
    for e in evs:
        if isinstance(e.payload, Command):
            firsts.setdefault(e.payload.command_id, (e, e.payload))
        elif isinstance(e.payload, CommandOutcome):
            outcomes.setdefault(e.payload.command_id, []).append((e, e.payload))
    return [CommandRecord(e, c, tuple(outcomes.get(cid, ()))) for cid, (e, c) in firsts.items()]


def _explicit_owner(rec: CommandRecord, incidents: list[IncidentRecord]) -> IncidentRecord | None:
    ids = {rec.event.event_id, rec.command.command_id, *(e.event_id for e, _o in rec.outcomes)}
    causes = set(rec.command.cause_verdict_ids)
    for inc in incidents:
        if inc.job_id != rec.event.job_id:
            continue
        if ids & inc.cited() or causes & {v.verdict_id for _e, v in inc.verdicts}:
            return inc
    return None


def _window_owner(rec: CommandRecord, incidents: list[IncidentRecord]) -> IncidentRecord | None:
    t = rec.event.event_time
    candidates = []
    for inc in incidents:
        end = inc.end
        if inc.job_id == rec.event.job_id and inc.start_us <= t and (
                end is None or t <= end[0].event_time):
            candidates.append(inc)
    return max(candidates, key=lambda i: (i.start_us, i.incident_id), default=None)
