"""Live traces: keep each job's recent incident-related events; emit an incident's trace once
it has ended and what its transitions cite has been read (once per incident).

The exporter reads every topic as one consumer, and Kafka orders records only within a
partition: an incident's end (``tg.incidents``) may be read before the verdict or command it
cites (``tg.verdicts``, ``tg.commands``), most of all while the exporter catches up. Emitting on
the end would then drop those spans for good. So an ended incident waits until every event id
its transitions cite has been seen, or ``grace_s`` (wall clock) has passed, whichever is first:
a cited event that never comes (or came before the exporter started) costs a late trace, not a
lost one. ``tick`` emits the incidents whose grace has passed; ``flush`` emits every waiting one
(on shutdown).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from trainguard.events.envelope import Event
from trainguard.events.payloads import Command, CommandOutcome, IncidentTransition, Verdict
from trainguard.traces.emit import TraceEmitter
from trainguard.traces.gather import END_STATES
from trainguard.traces.plan import plan_traces

KEPT = (IncidentTransition, Command, CommandOutcome, Verdict)


@dataclass
class _Waiting:
    job_id: str
    deadline: float
    missing: set[str]


@dataclass
class IncidentTraceSink:
    emitter: TraceEmitter
    per_job: int = 5_000
    jobs: int = 1_000
    grace_s: float = 10.0
    seen_ids: int = 200_000  # event ids remembered to know what a new end already has
    clock: Callable[[], float] = time.monotonic
    _buffers: OrderedDict[str, deque[Event]] = field(default_factory=OrderedDict)
    _emitted: OrderedDict[str, None] = field(default_factory=OrderedDict)
    _seen: OrderedDict[str, None] = field(default_factory=OrderedDict)
    _waiting: dict[str, _Waiting] = field(default_factory=dict)
    _awaited: dict[str, set[str]] = field(default_factory=dict)  # event id -> incident ids

    def __call__(self, event: Event) -> None:
        self._remember(event.event_id)
        p = event.payload
        if isinstance(p, KEPT):
            self._keep(event)
        if isinstance(p, IncidentTransition) and p.incident_id in self._waiting:
            self._await(p.incident_id, p.cause_event_ids)
        elif (isinstance(p, IncidentTransition) and p.to_state in END_STATES
              and p.incident_id not in self._emitted):
            self._start_waiting(event.job_id, p.incident_id)
        for iid in sorted(self._awaited.pop(event.event_id, ())):
            waiting = self._waiting.get(iid)
            if waiting is not None:
                waiting.missing.discard(event.event_id)
                if not waiting.missing:
                    self._emit(iid)

    def tick(self) -> None:
        """Emit the ended incidents whose grace has passed."""
        now = self.clock()
        for iid in sorted(i for i, w in self._waiting.items() if w.deadline <= now):
            self._emit(iid)

    def flush(self) -> None:
        """Emit every ended incident still waiting."""
        for iid in sorted(self._waiting):
            self._emit(iid)

    def _remember(self, event_id: str) -> None:
        self._seen[event_id] = None
        while len(self._seen) > self.seen_ids:
            self._seen.popitem(last=False)

    def _keep(self, event: Event) -> None:
        buf = self._buffers.get(event.job_id)
        if buf is None:
            buf = self._buffers[event.job_id] = deque(maxlen=self.per_job)
            while len(self._buffers) > self.jobs:
                self._buffers.popitem(last=False)
        self._buffers.move_to_end(event.job_id)
        buf.append(event)

    def _start_waiting(self, job_id: str, incident_id: str) -> None:
        self._waiting[incident_id] = _Waiting(job_id, self.clock() + self.grace_s, set())
        cited = [c for e in self._buffers.get(job_id, ())
                 if isinstance(e.payload, IncidentTransition)
                 and e.payload.incident_id == incident_id for c in e.payload.cause_event_ids]
        self._await(incident_id, cited)
        if not self._waiting[incident_id].missing:
            self._emit(incident_id)

    def _await(self, incident_id: str, cited: list[str]) -> None:
        waiting = self._waiting[incident_id]
        for c in cited:
            if c not in self._seen:
                waiting.missing.add(c)
                self._awaited.setdefault(c, set()).add(incident_id)

    def _emit(self, incident_id: str) -> None:
        waiting = self._waiting.pop(incident_id)
        for c in waiting.missing:
            left = self._awaited.get(c)
            if left is not None:
                left.discard(incident_id)
                if not left:
                    del self._awaited[c]
        for plan in plan_traces(self._buffers.get(waiting.job_id, ())):
            if plan.incident_id == incident_id:
                self.emitter.emit(plan)
        self._emitted[incident_id] = None
        while len(self._emitted) > 100_000:
            self._emitted.popitem(last=False)
