"""The fold as a live service runs it: arrivals in any order within the lateness bound,
released in (event_time, event_id) order by a reorder buffer, then folded per job.

Given the same events (any interleaving within ``lateness_us``, duplicates allowed) it emits
exactly what ``rebuild`` computes from the whole log. ``flush()`` releases what is buffered
(the service calls it when the log has been idle).

A record later than that (behind the released watermark) is not dropped: after a broker
outage the agents' spooled step reports flood in while the streams are still catching up, so
verdicts arrive behind step reports of later event times. The late record is put in its
place in the job's history and ``catch_up()`` folds the job again from there, so the books
end as ``rebuild`` makes them; a transition already published with other content stays on
the topic (the publisher counts it as a conflict and ``trainguard replay`` lists it). The
history is bounded: past ``history_max`` records per job, the oldest half is folded into a
base book and forgotten; a record older than that base is counted ``late`` and left out.
"""

from __future__ import annotations

import bisect
import copy
from dataclasses import dataclass, field
from typing import Any

from trainguard.events.codec import encode
from trainguard.events.envelope import Event
from trainguard.incidents.aggregate import FOLDED_TYPES, IncidentBook
from trainguard.incidents.model import order_key
from trainguard.incidents.settings import IncidentSettings
from trainguard.incidents.state_codec import (
    SnapshotError,
    book_from_doc,
    book_to_doc,
    event_from_doc,
    event_to_doc,
)
from trainguard.rules.ordering import ReorderBuffer

HISTORY_MAX = 400_000  # records per job kept for re-folding (step reports are most of them)


@dataclass(frozen=True, slots=True)
class _Raw:
    """A kept record as a snapshot had it: decoded only if it is folded again (most never
    are), so a restore does not decode the whole kept history."""

    event_time: int
    event_id: str
    raw: str

    def event(self) -> Event:
        try:
            return event_from_doc(self.raw)
        except Exception as exc:  # restored from a snapshot the codec no longer reads
            raise SnapshotError(f"kept record {self.event_id} of the snapshot does not "
                                f"decode: {exc}") from None


_Kept = Event | _Raw


def _key(kept: _Kept) -> tuple[int, str]:
    return (kept.event_time, kept.event_id)


@dataclass
class _Job:
    book: IncidentBook
    base: IncidentBook  # the fold of every record before ``history``
    buffer: ReorderBuffer
    history: list[_Kept] = field(default_factory=list)  # released, in order_key order
    ids: set[str] = field(default_factory=set)
    emitted: dict[str, bytes] = field(default_factory=dict)  # transition id -> bytes
    forgotten_until: tuple[int, str] | None = None  # order_key of the newest record in base
    dirty: bool = False  # a late record is in the history: fold again before going on


class LiveIncidents:
    def __init__(self, settings: IncidentSettings | None = None,
                 history_max: int = HISTORY_MAX) -> None:
        if history_max < 2:
            raise ValueError(f"history_max: must be >= 2 (got {history_max})")
        self.settings = settings or IncidentSettings()
        self.history_max = history_max
        self._jobs: dict[str, _Job] = {}
        self.late = 0  # records older than a job's kept history: left out
        self.refolded = 0  # records that came behind the watermark and were folded in

    @property
    def books(self) -> dict[str, IncidentBook]:
        return {name: job.book for name, job in self._jobs.items()}

    def feed(self, event: Event) -> list[Event]:
        if event.type not in FOLDED_TYPES:
            return []
        job = self._job(event.job_id)
        if event.event_time > job.buffer.watermark:
            return self._fold(job, job.buffer.push(event))
        if event.event_id in job.ids:
            return []  # a duplicate of a released record
        key = order_key(event)
        if job.forgotten_until is not None and key <= job.forgotten_until:
            self.late += 1  # before the kept history: cannot be put in its place
            return []
        job.history.insert(bisect.bisect_left(job.history, key, key=_key), event)
        job.ids.add(event.event_id)
        job.dirty = True
        self.refolded += 1
        return []

    def catch_up(self) -> list[Event]:
        """Fold again every job that took a late record; the transitions not emitted yet (or
        emitted with other content: the publisher reports those as conflicts)."""
        out: list[Event] = []
        for name in sorted(self._jobs):
            job = self._jobs[name]
            if not job.dirty:
                continue
            job.dirty = False
            job.book = copy.deepcopy(job.base)
            for i, kept in enumerate(job.history):
                ev = kept.event() if isinstance(kept, _Raw) else kept
                job.history[i] = ev
                out += self._new(job, job.book.apply(ev))
        return out

    def flush(self) -> list[Event]:
        out: list[Event] = []
        for name in sorted(self._jobs):
            job = self._jobs[name]
            out += self._fold(job, job.buffer.drain())
        return out + self.catch_up()

    def snapshot(self) -> dict[str, Any]:
        """The whole state as JSON values (``restore`` puts it back): each job's books, reorder
        buffer, kept history and the transitions emitted."""
        jobs = {}
        for name in sorted(self._jobs):
            job = self._jobs[name]
            jobs[name] = {
                "book": book_to_doc(job.book),
                "base": book_to_doc(job.base),
                "buffer": job.buffer.snapshot(),
                "history": [[k.event_time, k.event_id,
                             k.raw if isinstance(k, _Raw) else event_to_doc(k)]
                            for k in job.history],
                "emitted": {i: b.decode() for i, b in job.emitted.items()},
                "forgotten_until": None if job.forgotten_until is None
                else list(job.forgotten_until),
                "dirty": job.dirty,
            }
        return {"history_max": self.history_max, "late": self.late,
                "refolded": self.refolded, "jobs": jobs}

    def restore(self, doc: dict[str, Any]) -> None:
        """Replace the state with a ``snapshot()``'s (this instance's settings: the caller
        checks they are the snapshot's); ``SnapshotError`` if it does not fit, and then the
        state is left as it was."""
        try:
            jobs: dict[str, _Job] = {}
            for name, j in doc["jobs"].items():
                buffer = ReorderBuffer(self.settings.lateness_us)
                buffer.restore(j["buffer"])
                history: list[_Kept] = [_Raw(int(t), str(i), _text(raw))
                                        for t, i, raw in j["history"]]
                until = j["forgotten_until"]
                jobs[str(name)] = _Job(
                    book=book_from_doc(j["book"], self.settings),
                    base=book_from_doc(j["base"], self.settings),
                    buffer=buffer, history=history, ids={e.event_id for e in history},
                    emitted={str(i): str(b).encode() for i, b in j["emitted"].items()},
                    forgotten_until=None if until is None else (int(until[0]), str(until[1])),
                    dirty=bool(j["dirty"]))
            late, refolded = int(doc["late"]), int(doc["refolded"])
            history_max = int(doc["history_max"])
        except SnapshotError:
            raise
        except Exception as exc:  # any shape that is not a snapshot's
            raise SnapshotError(f"{type(exc).__name__}: {exc}") from None
        if history_max != self.history_max:
            raise SnapshotError(f"history_max: {history_max} in the snapshot, "
                                f"{self.history_max} here")
        self._jobs, self.late, self.refolded = jobs, late, refolded

    @property
    def dirty(self) -> bool:
        """A late record is in some job's history and ``catch_up`` has not folded it yet."""
        return any(job.dirty for job in self._jobs.values())

    @property
    def buffered(self) -> int:
        return sum(len(job.buffer) for job in self._jobs.values())

    def _job(self, name: str) -> _Job:
        job = self._jobs.get(name)
        if job is None:
            job = self._jobs[name] = _Job(IncidentBook(name, self.settings),
                                          IncidentBook(name, self.settings),
                                          ReorderBuffer(self.settings.lateness_us))
        return job

    def _fold(self, job: _Job, released: list[Event]) -> list[Event]:
        out: list[Event] = []
        for ev in released:  # all after the history (the buffer releases past its watermark)
            if ev.event_id in job.ids:
                continue
            job.history.append(ev)
            job.ids.add(ev.event_id)
            if not job.dirty:  # else catch_up folds it with the late record in its place
                out += self._new(job, job.book.apply(ev))
        if len(job.history) > self.history_max:
            self._forget_oldest(job)
        return out

    def _new(self, job: _Job, transitions: list[Event]) -> list[Event]:
        out = []
        for t in transitions:
            data = encode(t)
            if job.emitted.get(t.event_id) != data:
                job.emitted[t.event_id] = data
                out.append(t)
        return out

    def _forget_oldest(self, job: _Job) -> None:
        if job.dirty:
            return  # after the catch-up
        half = len(job.history) // 2
        for kept in job.history[:half]:
            job.base.apply(kept.event() if isinstance(kept, _Raw) else kept)
            job.ids.discard(kept.event_id)
        job.forgotten_until = _key(job.history[half - 1])
        del job.history[:half]


def _text(raw: object) -> str:
    if not isinstance(raw, str):
        raise SnapshotError(f"history: an encoded event is a JSON string (got "
                            f"{type(raw).__name__})")
    return raw
