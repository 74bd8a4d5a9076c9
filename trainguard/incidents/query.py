"""Incidents for the command line: rebuilt from a log, next to what the log recorded."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainguard.events.codec import encode
from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentTransition
from trainguard.incidents.aggregate import rebuild_incidents
from trainguard.incidents.model import Incident
from trainguard.incidents.settings import IncidentSettings


def canonical(event: Event) -> bytes:
    """The bytes that must match between a recording and a rebuild (ingest time aside: the
    producer stamps it when it publishes)."""
    return encode(event.model_copy(update={"ingest_time": None}))


@dataclass
class IncidentView:
    incident: Incident
    recorded: list[Event] = field(default_factory=list)

    @property
    def status(self) -> str:
        """'recorded' (the log holds exactly these transitions), 'not recorded', or 'differs'."""
        if not self.recorded:
            return "not recorded"
        mine = sorted(canonical(t) for t in self.incident.transitions)
        theirs = sorted({canonical(t) for t in self.recorded})
        return "recorded" if mine == theirs else "differs"


class IncidentNotFound(LookupError):
    pass


def recorded_transitions(events: Sequence[Event]) -> dict[str, list[Event]]:
    out: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        if isinstance(e.payload, IncidentTransition):
            out[e.payload.incident_id].append(e)
    return dict(out)


def incident_views(events: Sequence[Event], settings: IncidentSettings | None = None,
                   job: str | None = None) -> list[IncidentView]:
    books = rebuild_incidents(events, settings)
    recorded = recorded_transitions(events)
    views = [IncidentView(inc, recorded.get(inc.incident_id, []))
             for jid, book in sorted(books.items()) if job is None or jid == job
             for inc in book.incidents.values()]
    return sorted(views, key=lambda v: (v.incident.opened_at, v.incident.incident_id))


def find(views: Sequence[IncidentView], wanted: str) -> IncidentView:
    """By id or unambiguous id prefix (at least 4 characters)."""
    hits = [v for v in views if v.incident.incident_id == wanted]
    if not hits and len(wanted) >= 4:
        hits = [v for v in views if v.incident.incident_id.startswith(wanted)]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise IncidentNotFound(f"ID: no incident {wanted!r} in this log ({len(views)} incidents;"
                               " `trainguard incident list` shows them)")
    raise IncidentNotFound(f"ID: {wanted!r} is ambiguous: "
                           + ", ".join(v.incident.incident_id for v in hits))
