"""The fold as a live service runs it: arrivals in any order within the lateness bound,
released in (event_time, event_id) order by a reorder buffer, then folded per job.

Given the same events (any interleaving within ``lateness_us``, duplicates allowed) it emits
exactly what ``rebuild`` computes from the whole log. ``flush()`` releases what is buffered
(the service calls it when the log has been idle); events that arrive later than the flushed
watermark are counted as late and left out, as they would be in the rules.
"""

from __future__ import annotations

from trainguard.events.envelope import Event
from trainguard.incidents.aggregate import FOLDED_TYPES, IncidentBook
from trainguard.incidents.settings import IncidentSettings
from trainguard.rules.ordering import ReorderBuffer


class LiveIncidents:
    def __init__(self, settings: IncidentSettings | None = None) -> None:
        self.settings = settings or IncidentSettings()
        self.books: dict[str, IncidentBook] = {}
        self._buffers: dict[str, ReorderBuffer] = {}

    def feed(self, event: Event) -> list[Event]:
        if event.type not in FOLDED_TYPES:
            return []
        buf = self._buffers.get(event.job_id)
        if buf is None:
            buf = self._buffers[event.job_id] = ReorderBuffer(self.settings.lateness_us)
        return self._fold(event.job_id, buf.push(event))

    def flush(self) -> list[Event]:
        out: list[Event] = []
        for job, buf in sorted(self._buffers.items()):
            out += self._fold(job, buf.drain())
        return out

    @property
    def late(self) -> int:
        return sum(b.late for b in self._buffers.values())

    @property
    def buffered(self) -> int:
        return sum(len(b) for b in self._buffers.values())

    def _fold(self, job: str, released: list[Event]) -> list[Event]:
        if not released:
            return []
        book = self.books.get(job)
        if book is None:
            book = self.books[job] = IncidentBook(job, self.settings)
        out: list[Event] = []
        for ev in released:
            out += book.apply(ev)
        return out
