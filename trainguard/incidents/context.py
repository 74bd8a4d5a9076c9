"""The events around the incidents, kept in memory for their served timeline pages
(``incident serve --http-port``): what the incident service consumed, plus the node telemetry
and drill injections the timeline's network, GPU and drill marks come from.

Bounded, oldest first out: per job ``per_job`` events, per node ``per_node`` node events
(telemetry batches, node health). Deduplicated by event id (the service reads the history and
then its consumer group from the beginning: the same records twice). A page for an incident
older than what is kept shows the marks that are left; ``trainguard incident show`` reads the
whole log.
"""

from __future__ import annotations

from collections import OrderedDict

from trainguard.events.envelope import Event
from trainguard.incidents.model import Incident
from trainguard.timeline.build import NODE_TYPES

PER_JOB = 200_000
PER_NODE = 50_000


class EventContext:
    def __init__(self, per_job: int = PER_JOB, per_node: int = PER_NODE) -> None:
        if per_job < 1 or per_node < 1:
            raise ValueError(f"per_job, per_node: must be >= 1 (got {per_job}, {per_node})")
        self.per_job = per_job
        self.per_node = per_node
        self._jobs: dict[str, OrderedDict[str, Event]] = {}
        self._nodes: dict[str, OrderedDict[str, Event]] = {}
        self._ran_on: dict[str, set[str]] = {}  # job -> the nodes its step reports came from
        self.dropped = 0  # events pushed out by the bounds

    def add(self, event: Event) -> None:
        if event.type in NODE_TYPES:
            if event.subject.node is None:
                return
            self._put(self._nodes, event.subject.node, event, self.per_node)
        else:
            self._put(self._jobs, event.job_id, event, self.per_job)
            if event.type == "step.report" and event.subject.node is not None:
                self._ran_on.setdefault(event.job_id, set()).add(event.subject.node)

    def _put(self, where: dict[str, OrderedDict[str, Event]], key: str, event: Event,
             bound: int) -> None:
        kept = where.setdefault(key, OrderedDict())
        if event.event_id in kept:
            return
        kept[event.event_id] = event
        if len(kept) > bound:
            kept.popitem(last=False)
            self.dropped += 1

    def job_events(self, job_id: str) -> list[Event]:
        return list(self._jobs.get(job_id, {}).values())

    def for_incident(self, inc: Incident) -> list[Event]:
        """The job's events and the node events of the nodes it ran on (a superset of what
        ``build_timeline`` picks its window from), copied: no scan of the events here, so
        the caller can take it in the fold's loop and build the timeline elsewhere."""
        out = self.job_events(inc.job_id)
        nodes = set(inc.nodes) | {b.node for b in inc.bindings if b.node} | {
            f.node for f in inc.fences if f.node} | self._ran_on.get(inc.job_id, set())
        for node in sorted(nodes):
            out += self._nodes.get(node, {}).values()
        return out

    def __len__(self) -> int:
        return sum(len(k) for k in self._jobs.values()) + sum(len(k) for k in self._nodes.values())
