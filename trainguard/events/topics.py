"""The topic registry: every topic, its partitions, its key and its retention.

The event log keeps everything (``retention.ms=-1``, ``cleanup.policy=delete``): replay and
audit need the whole history. Compaction is only for derived tables (faust changelogs), which
faust creates itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class TopicRole(StrEnum):
    TELEMETRY = "telemetry"
    TASK = "task"
    VERDICTS = "verdicts"
    COMMANDS = "commands"
    OUTCOMES = "outcomes"
    DRILLS = "drills"
    INCIDENTS = "incidents"
    DLQ = "dlq"


@dataclass(frozen=True)
class TopicSpec:
    role: TopicRole
    partitions: int
    key: Literal["job", "source key"]
    description: str
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


TOPIC_SPECS: tuple[TopicSpec, ...] = (
    TopicSpec(TopicRole.TELEMETRY, 12, "job",
              "Per-node telemetry batches and node health; as many partitions as the task "
              "topic, so a job's telemetry and task events meet in one streams worker."),
    TopicSpec(TopicRole.TASK, 12, "job",
              "Step reports, heartbeats, process exits, checkpoints: one job stays ordered."),
    TopicSpec(TopicRole.VERDICTS, 6, "job", "Verdicts opened and resolved by the streams."),
    TopicSpec(TopicRole.COMMANDS, 3, "job", "Signed remediation commands."),
    TopicSpec(TopicRole.OUTCOMES, 12, "job",
              "Command outcomes, pool events and refusals from the actuators, signed by them; "
              "as many partitions as the task topic, so a streams worker sees a job's "
              "verified bindings with its reports."),
    TopicSpec(TopicRole.DRILLS, 3, "job", "Fault injections by drills."),
    TopicSpec(TopicRole.INCIDENTS, 3, "job", "Incident state transitions."),
    TopicSpec(TopicRole.DLQ, 3, "source key",
              "Records refused at the edge, with the reason and the original bytes."),
)

SPEC_BY_ROLE = {s.role: s for s in TOPIC_SPECS}
# Every topic that holds events (the dead-letter topic holds refused bytes, not events).
EVENT_ROLES: tuple[TopicRole, ...] = tuple(r for r in TopicRole if r is not TopicRole.DLQ)


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
