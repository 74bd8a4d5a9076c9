"""The catalogue of event types: payload model, current version, topic, key and meaning.

This is the single source of truth; ``docs/events.md`` is rendered from it and a test keeps the
two in step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from trainguard.compat import StrEnum
from trainguard.events import payloads as p
from trainguard.events.topics import TopicRole

KeyBy = Literal["job"]  # every topic is keyed by job: a job's records meet in one partition
SubjectField = Literal["node", "gpu", "rank", "link", "unit"]
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class Signer(StrEnum):
    """Who signs a type's payload (``signature``), with what key (``actuators/signing.py``).
    A record of a signed type that does not verify is dead-lettered, never believed."""

    DECIDE = "decide"  # the command private key, held by `trainguard decide` only
    ACTUATOR = "actuator"  # each actuator's own key; readers trust a configured set


@dataclass(frozen=True)
class EventType:
    name: str
    version: int
    payload: type[p.Payload]
    topic: TopicRole
    key_by: KeyBy
    summary: str
    requires_subject: tuple[SubjectField, ...] = ()
    signed_by: Signer | None = None
    # Urgent: a copy also goes to the urgent topic, which the streams worker reads apart from
    # the telemetry and step volume, so the prompt lane decides it on arrival whatever the
    # backlog (``topics``; ``rules/engine.py``). Every type a rule answers promptly is one.
    urgent: bool = False

    @property
    def topics(self) -> tuple[TopicRole, ...]:
        """Where a record of this type is written: its own topic, then the urgent copy."""
        return (self.topic, TopicRole.URGENT) if self.urgent else (self.topic,)


EVENT_TYPES: tuple[EventType, ...] = (
    EventType("telemetry.node", 1, p.NodeTelemetry, TopicRole.TELEMETRY, "job",
              "All GPU, NIC, peer-path and rank-process samples of one node for one interval.",
              ("node",)),
    EventType("node.health", 1, p.NodeHealth, TopicRole.TELEMETRY, "job",
              "A discrete node signal: kernel XID/AER/link/OOM line, imported fault log entry.",
              ("node",), urgent=True),
    EventType("step.report", 2, p.StepReport, TopicRole.TASK, "job",
              "One training step of one rank: timings, data position, loss, binding epoch.",
              ("rank",)),
    EventType("heartbeat", 2, p.Heartbeat, TopicRole.TASK, "job",
              "A rank is alive between step reports (long steps, checkpoints, data waits); "
              "v2: the section of its step it is in, and since when.",
              ("rank",)),
    EventType("process.exit", 1, p.ProcessExit, TopicRole.TASK, "job",
              "A rank process ended: exit code or signal, how the exit was seen, and what the "
              "rank declared before it ended.",
              ("node",), urgent=True),
    EventType("process.departure", 1, p.ProcessDeparture, TopicRole.TASK, "job",
              "A rank said it was about to end, with its exit code and why (completed, lost a "
              "peer, its own error); the agent also attaches it to the rank's process.exit.",
              ("rank",)),
    EventType("checkpoint", 1, p.CheckpointEvent, TopicRole.TASK, "job",
              "A checkpoint was written, verified, found corrupt or loaded."),
    EventType("verdict", 1, p.Verdict, TopicRole.VERDICTS, "job",
              "A rule opened or resolved a located, evidenced verdict."),
    EventType("command", 1, p.Command, TopicRole.COMMANDS, "job",
              "A signed remediation decision for the actuator (tier 1-3 or escalation).",
              signed_by=Signer.DECIDE),
    EventType("command.outcome", 1, p.CommandOutcome, TopicRole.OUTCOMES, "job",
              "What happened to a command: accepted, done, failed, timed out or refused. A "
              "failed one with `data.retry` (the condition, e.g. `storage_unreachable`) "
              "changed nothing and may succeed once that clears: the policy retries it.",
              signed_by=Signer.ACTUATOR),
    EventType("pool.unit", 1, p.PoolUnit, TopicRole.OUTCOMES, "job",
              "A pool unit became spare, bound (rank, epoch), draining, fenced or failed.",
              ("unit",), signed_by=Signer.ACTUATOR),
    EventType("replica.refused", 1, p.ReplicaRefused, TopicRole.OUTCOMES, "job",
              "A stale replica (old binding epoch) was refused: its reports discarded; killed "
              "only when the actuator launched it and re-proves its pid.",
              ("rank",), signed_by=Signer.ACTUATOR),
    EventType("job.ended", 1, p.JobEnded, TopicRole.OUTCOMES, "job",
              "The scheduler ended the job's allocation (cancelled, time limit, node failure, "
              "...): decide stops acting on the job, its open incidents end.",
              signed_by=Signer.ACTUATOR),
    EventType("injection", 1, p.Injection, TopicRole.DRILLS, "job",
              "A drill injected (or rolled back) one fault."),
    EventType("incident.transition", 1, p.IncidentTransition, TopicRole.INCIDENTS, "job",
              "An incident moved between detected, located, mitigating and its end states."),
)

BY_NAME: Mapping[str, EventType] = {t.name: t for t in EVENT_TYPES}
SIGNED_TYPES: Mapping[str, Signer] = {t.name: t.signed_by for t in EVENT_TYPES
                                      if t.signed_by is not None}
URGENT_TYPES: frozenset[str] = frozenset(t.name for t in EVENT_TYPES if t.urgent)


def _step_report_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    """v1 carried one ``data_position`` (samples consumed); v2 names it and adds the layout.

    The layout fields (dp_rank, pp_stage, tp_rank) and binding_epoch are additive with
    defaults, so only the rename needs work here.
    """
    out = dict(payload)
    if "data_position" in out:
        out.setdefault("samples_consumed", out.pop("data_position"))
    return out


def _heartbeat_v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    """v2 adds ``section`` and ``section_start``, both absent for a v1 heartbeat (no section
    was known): nothing to change."""
    return dict(payload)


# (type, from_version) -> function producing the payload of from_version + 1.
UPCASTERS: Mapping[tuple[str, int], Upcaster] = {
    ("step.report", 1): _step_report_v1_to_v2,
    ("heartbeat", 1): _heartbeat_v1_to_v2,
}


def upcast(type_name: str, version: int, payload: dict[str, Any]) -> dict[str, Any]:
    """Bring a payload written at ``version`` up to the current version of its type."""
    current = BY_NAME[type_name].version
    while version < current:
        payload = UPCASTERS[(type_name, version)](payload)
        version += 1
    return payload
