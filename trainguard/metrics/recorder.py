"""Events -> metric updates. No I/O: the service feeds it what it reads from Kafka."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from trainguard.bus.dlq import DeadLetter
from trainguard.events.envelope import Event
from trainguard.events.payloads import (
    CheckpointEvent,
    Command,
    CommandOutcome,
    IncidentTransition,
    NodeTelemetry,
    ProcessState,
    StepReport,
    Verdict,
    VerdictKind,
    VerdictState,
)
from trainguard.events.topics import TopicNames
from trainguard.metrics.expiry import SeriesExpiry
from trainguard.metrics.incidents import OpenIncidents
from trainguard.metrics.registry import PipelineMetrics

US = 1_000_000


@dataclass
class Recorder:
    """Applies each event once (by event id, within a bounded memory) to the metrics."""

    metrics: PipelineMetrics
    series_ttl_s: float = 3600.0
    dedupe_capacity: int = 100_000
    incidents: OpenIncidents = field(default_factory=OpenIncidents)
    _seen: OrderedDict[str, None] = field(default_factory=OrderedDict)
    _latest_step_time: dict[str, int] = field(default_factory=dict)
    _external_faults: dict[str, str] = field(default_factory=dict)  # open verdict id -> node

    def __post_init__(self) -> None:
        self.expiry = SeriesExpiry(int(self.series_ttl_s * US))

    def observe(self, event: Event, topic_role: str) -> bool:
        """Count one event read from the topic with this role; False for a duplicate."""
        if event.event_id in self._seen:
            return False
        self._seen[event.event_id] = None
        if len(self._seen) > self.dedupe_capacity:
            self._seen.popitem(last=False)
        m = self.metrics
        m.events.labels(event.type, topic_role).inc()
        if event.ingest_time is not None:
            lag_s = max(0, event.ingest_time - event.event_time) / US
            m.ingest_lag.labels(topic_role).observe(lag_s)
        self._by_payload(event)
        return True

    def _by_payload(self, event: Event) -> None:
        p = event.payload
        if isinstance(p, StepReport):
            self._step(event, p)
        elif isinstance(p, Verdict):
            self._verdict(event, p)
        elif isinstance(p, Command):
            self.metrics.commands.labels(p.action.value, str(p.tier)).inc()
        elif isinstance(p, CommandOutcome):
            self.metrics.outcomes.labels(p.action.value, p.status.value).inc()
        elif isinstance(p, IncidentTransition):
            self._transition(event, p)
        elif isinstance(p, NodeTelemetry):
            self._ranks_on_gpus(event, p)
        elif isinstance(p, CheckpointEvent):
            labels = (event.job_id, p.action.value)
            self.expiry.set(self.metrics.checkpoint_step, labels, p.step, event.event_time)
            self.expiry.set(self.metrics.checkpoint_time, labels, event.event_time / US,
                            event.event_time)

    def _step(self, event: Event, p: StepReport) -> None:
        m = self.metrics
        self.expiry.set(m.step_compute, (event.job_id, str(p.rank)), p.compute_ms / 1000,
                        event.event_time)
        if event.event_time >= self._latest_step_time.get(event.job_id, 0):
            self._latest_step_time[event.job_id] = event.event_time
            self.expiry.set(m.last_step, (event.job_id,), p.step, event.event_time)

    def _ranks_on_gpus(self, event: Event, p: NodeTelemetry) -> None:
        """``trainguard_rank_info{job_id, rank, node, gpu} 1`` for each live rank process whose
        GPU is known; it expires with the series TTL once the rank is no longer seen."""
        node = event.subject.node
        if node is None:
            return
        for proc in p.processes:
            if proc.rank is None or proc.gpu is None or proc.job_id is None:
                continue
            labels = (proc.job_id, str(proc.rank), node, str(proc.gpu))
            if proc.state in (ProcessState.EXITED, ProcessState.ZOMBIE):
                self.expiry.remove(self.metrics.rank_info, labels)
            else:
                self.expiry.set(self.metrics.rank_info, labels, 1, event.event_time)

    def _verdict(self, event: Event, p: Verdict) -> None:
        self.metrics.verdicts.labels(p.kind.value, p.state.value, p.severity.value).inc()
        if p.kind is VerdictKind.EXTERNAL_FAULT:
            self._external_fault(event, p)
            return
        rank = event.subject.rank
        if p.kind is not VerdictKind.STRAGGLER or rank is None:
            return
        labels = (event.job_id, str(rank))
        ratio = p.evidence.get("ratio")
        if p.state is VerdictState.RESOLVED:
            self.expiry.remove(self.metrics.straggler_ratio, labels)
        elif isinstance(ratio, int | float) and not isinstance(ratio, bool):
            self.expiry.set(self.metrics.straggler_ratio, labels, float(ratio), event.event_time)

    def _external_fault(self, event: Event, p: Verdict) -> None:
        """``trainguard_nodes_external_fault``: distinct nodes with an open external fault."""
        if p.state is VerdictState.RESOLVED:
            self._external_faults.pop(p.verdict_id, None)
        elif event.subject.node is not None:
            self._external_faults[p.verdict_id] = event.subject.node
        self.metrics.nodes_external_fault.set(len(set(self._external_faults.values())))

    def _transition(self, event: Event, p: IncidentTransition) -> None:
        m = self.metrics
        m.transitions.labels(p.to_state.value).inc()
        self.expiry.set(m.transition_time, (event.job_id, p.to_state.value),
                        event.event_time / US, event.event_time)
        duration = self.incidents.apply(p, event.event_time)
        if duration is not None:
            m.recovery.observe(duration)
        m.incidents_open.set(self.incidents.count())
        oldest = self.incidents.oldest_detected_us()
        m.oldest_open.set(0 if oldest is None else oldest / US)

    def invalid(self, topic_role: str) -> None:
        self.metrics.invalid.labels(topic_role).inc()

    def dead_letter(self, letter: DeadLetter, names: TopicNames) -> None:
        try:
            source = names.role_of(letter.source_topic).value
        except KeyError:
            source = "other"
        self.metrics.dlq.labels(source, _bounded(letter.consumer)).inc()

    def sweep(self, now_us: int) -> int:
        removed = self.expiry.sweep(now_us)
        horizon = now_us - self.expiry.ttl_us
        for job in [j for j, t in self._latest_step_time.items() if t < horizon]:
            del self._latest_step_time[job]
        return removed


def _bounded(consumer: str, limit: int = 64) -> str:
    """Consumer names are service names; cut anything longer (one label value per service)."""
    return consumer[:limit] or "unknown"
