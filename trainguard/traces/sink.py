"""Live traces: keep each job's recent incident-related events; emit an incident's trace once
it reaches an end state (once per incident)."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from trainguard.events.envelope import Event
from trainguard.events.payloads import Command, CommandOutcome, IncidentTransition, Verdict
from trainguard.traces.emit import TraceEmitter
from trainguard.traces.gather import END_STATES
from trainguard.traces.plan import plan_traces

KEPT = (IncidentTransition, Command, CommandOutcome, Verdict)


@dataclass
class IncidentTraceSink:
    emitter: TraceEmitter
    per_job: int = 5_000
    jobs: int = 1_000
    _buffers: OrderedDict[str, deque[Event]] = field(default_factory=OrderedDict)
    _emitted: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def __call__(self, event: Event) -> None:
        if not isinstance(event.payload, KEPT):
            return
        buf = self._buffers.get(event.job_id)
        if buf is None:
            buf = self._buffers[event.job_id] = deque(maxlen=self.per_job)
            while len(self._buffers) > self.jobs:
                self._buffers.popitem(last=False)
        self._buffers.move_to_end(event.job_id)
        buf.append(event)
        p = event.payload
        if isinstance(p, IncidentTransition) and p.to_state in END_STATES:
            self._emit(event.job_id, p.incident_id)

    def _emit(self, job_id: str, incident_id: str) -> None:
        if incident_id in self._emitted:
            return
        for plan in plan_traces(self._buffers[job_id]):
            if plan.incident_id == incident_id:
                self.emitter.emit(plan)
        self._emitted[incident_id] = None
        while len(self._emitted) > 100_000:
            self._emitted.popitem(last=False)
