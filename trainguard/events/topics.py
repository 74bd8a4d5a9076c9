"""The topic registry: every topic, its partitions, its key, its retention, and which
service may write and read it (the broker's ACLs are derived from that, ``bus/acl.py``).

The event log keeps everything (``retention.ms=-1``, ``cleanup.policy=delete``): replay and
audit need the whole history. Compaction is only for derived tables (faust changelogs), which
faust creates itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from trainguard.compat import StrEnum


class TopicRole(StrEnum):
    TELEMETRY = "telemetry"
    TASK = "task"
    URGENT = "urgent"
    VERDICTS = "verdicts"
    COMMANDS = "commands"
    OUTCOMES = "outcomes"
    DRILLS = "drills"
    INCIDENTS = "incidents"
    DLQ = "dlq"


class Service(StrEnum):
    """Who talks to the broker: one principal each on a secured broker (``bus/acl.py``)."""

    AGENT = "agent"            # node agents: collectors, rank reports, spool replay
    STREAMS = "streams"        # the faust rules workers
    DECIDE = "decide"          # verdicts -> commands
    ACTUATOR = "actuator"      # commands -> outcomes and pool events
    INCIDENTS = "incidents"    # `incident serve`: the incident fold
    ALERTS = "alerts"          # incident transitions -> notifications
    METRICS = "metrics"        # Prometheus exporter over every topic and group lag
    DRILLS = "drills"          # fault injections and the drills' log tail
    OPERATOR = "operator"      # read-only tools: events tail, replay, incident list, timeline


@dataclass(frozen=True)
class TopicSpec:
    role: TopicRole
    partitions: int
    key: Literal["job", "source key"]
    description: str
    writers: frozenset[Service]
    readers: frozenset[Service]
    retention_ms: int = -1
    cleanup_policy: Literal["delete"] = "delete"

    def configs(self) -> dict[str, str]:
        return {
            "retention.ms": str(self.retention_ms),
            "retention.bytes": "-1",
            "cleanup.policy": self.cleanup_policy,
            # Event times, not broker append times, place records on the axis.
            "message.timestamp.type": "CreateTime",
        }


S = Service
# Every topic is readable by the read-only tools and the metrics exporter.
_ALL_SEE = frozenset({S.METRICS, S.OPERATOR})
_EVENT_SPECS: tuple[TopicSpec, ...] = (
    TopicSpec(TopicRole.TELEMETRY, 12, "job",
              "Per-node telemetry batches and node health; as many partitions as the task "
              "topic, so a job's telemetry and task events meet in one streams worker.",
              writers=frozenset({S.AGENT}),
              # incidents: the served timeline pages draw the network and GPU tracks from it
              readers=_ALL_SEE | {S.AGENT, S.STREAMS, S.INCIDENTS}),
    TopicSpec(TopicRole.TASK, 12, "job",
              "Step reports, heartbeats, process exits, checkpoints: one job stays ordered.",
              writers=frozenset({S.AGENT}),
              readers=_ALL_SEE | {S.AGENT, S.STREAMS, S.DECIDE, S.ACTUATOR, S.INCIDENTS,
                                  S.DRILLS}),
    # The urgent lane: a second copy (same event id, same bytes) of each event of an urgent
    # type (``registry.URGENT_TYPES``), so the streams worker decides it on arrival even while
    # its task and telemetry partitions hold a backlog. The log keeps the original on its own
    # topic (everyone else reads that one); the copies are only the prompt lane's input, so
    # they are kept a week, not forever.
    TopicSpec(TopicRole.URGENT, 12, "job",
              "Copies of the urgent events (process exits, node health) for the streams "
              "worker's prompt lane; as many partitions as the task topic. Not the log: the "
              "original of each copy is on its own topic.",
              # agent: after an outage its publisher reads the tail to settle what it wrote
              writers=frozenset({S.AGENT}), readers=_ALL_SEE | {S.AGENT, S.STREAMS},
              retention_ms=7 * 24 * 3600 * 1000),
    TopicSpec(TopicRole.VERDICTS, 6, "job", "Verdicts opened and resolved by the streams.",
              writers=frozenset({S.STREAMS}),
              readers=_ALL_SEE | {S.DECIDE, S.INCIDENTS, S.DRILLS}),
    TopicSpec(TopicRole.COMMANDS, 3, "job", "Signed remediation commands.",
              writers=frozenset({S.DECIDE}),
              readers=_ALL_SEE | {S.DECIDE, S.ACTUATOR, S.INCIDENTS, S.DRILLS}),
    # streams reads it too: the rules believe bindings only from verified pool events
    TopicSpec(TopicRole.OUTCOMES, 12, "job",
              "Command outcomes, pool events and refusals from the actuators, signed by them; "
              "as many partitions as the task topic, so a streams worker sees a job's "
              "verified bindings with its reports.",
              writers=frozenset({S.ACTUATOR}),
              readers=_ALL_SEE | {S.STREAMS, S.DECIDE, S.ACTUATOR, S.INCIDENTS, S.DRILLS}),
    TopicSpec(TopicRole.DRILLS, 3, "job", "Fault injections by drills.",
              writers=frozenset({S.DRILLS}),
              readers=_ALL_SEE | {S.DRILLS, S.INCIDENTS}),  # incidents: the served timelines
    TopicSpec(TopicRole.INCIDENTS, 3, "job", "Incident state transitions.",
              writers=frozenset({S.INCIDENTS}),
              readers=_ALL_SEE | {S.ALERTS, S.DRILLS}),
)
# Every consumer of an event topic may dead-letter what it cannot decode or verify.
_CONSUMERS = frozenset(svc for spec in _EVENT_SPECS for svc in spec.readers)
TOPIC_SPECS: tuple[TopicSpec, ...] = (
    *_EVENT_SPECS,
    TopicSpec(TopicRole.DLQ, 3, "source key",
              "Records refused at the edge, with the reason and the original bytes.",
              writers=_CONSUMERS, readers=_ALL_SEE),
)
del S

SPEC_BY_ROLE = {s.role: s for s in TOPIC_SPECS}
# The log: every topic that holds events, each event once (the dead-letter topic holds refused
# bytes, the urgent topic copies of events that are on their own topics too).
EVENT_ROLES: tuple[TopicRole, ...] = tuple(
    r for r in TopicRole if r not in (TopicRole.DLQ, TopicRole.URGENT))


@dataclass(frozen=True)
class TopicNames:
    """Concrete topic names under a prefix, so tests and tenants never share topics."""

    prefix: str = "tg"

    def name(self, role: TopicRole) -> str:
        return f"{self.prefix}.{role.value}"

    def all(self) -> dict[TopicRole, str]:
        return {s.role: self.name(s.role) for s in TOPIC_SPECS}

    def role_of(self, topic: str) -> TopicRole:
        for role, name in self.all().items():
            if name == topic:
                return role
        raise KeyError(f"topic {topic!r} is not under prefix {self.prefix!r}")
