"""The broker's ACLs, derived from the topic registry: one principal per service.

Pure: ``acl_bindings(prefix)`` lists every ALLOW rule for the topics under one prefix; the
secured dev broker (``dev/kafka.py``) creates them with ``bus/admin.apply_acls`` and
docs/security-broker.md renders them with ``render_acl_table``. Nothing here is restated by
hand: who writes and reads each topic is ``TopicSpec.writers`` / ``readers``.

Besides the registry's topics:
- every reader gets the consumer groups named ``<prefix>-<service>...`` (its own only);
- the streams workers own everything named ``<prefix>-streams...``: faust's changelog and
  leader topics, its group and its transactional ids (exactly-once);
- metrics may describe the groups named ``<prefix>-...`` (their lag is what it exports);
- decide owns the transactional ids named ``<prefix>-decide...``: one fenced producer per
  commands partition it holds as the active instance (``actuators/decider.py``);
- the admin principal is a super user (topics, ACLs); it is no service's identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from trainguard.events.topics import TOPIC_SPECS, Service, TopicNames

ADMIN_USER = "admin"


class ResourceType(IntEnum):  # Kafka's wire values
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(IntEnum):
    LITERAL = 3
    PREFIXED = 4


class Operation(IntEnum):
    ALL = 2
    READ = 3
    WRITE = 4
    DESCRIBE = 8


ALLOW = 3  # AclPermissionType.ALLOW


@dataclass(frozen=True, order=True)
class AclBinding:
    principal: str
    resource: ResourceType
    name: str
    pattern: PatternType
    operation: Operation

    def describe(self) -> str:
        star = "*" if self.pattern is PatternType.PREFIXED else ""
        return (f"{self.principal} {self.operation.name} "
                f"{self.resource.name.lower()} {self.name}{star}")


def principal(service: Service) -> str:
    return f"User:{service.value}"


def streams_prefix(prefix: str) -> str:
    """faust's app id (``streams/app.py``): its internal topics, group and transactional ids."""
    return f"{prefix}-streams"


def group_prefix(prefix: str, service: Service) -> str:
    return f"{prefix}-{service.value}"


def acl_bindings(prefix: str) -> tuple[AclBinding, ...]:
    """Every ALLOW rule for the topics under ``prefix``, sorted; everything else is denied."""
    names = TopicNames(prefix)
    out: set[AclBinding] = set()

    def allow(svc: Service, res: ResourceType, name: str, pattern: PatternType,
              op: Operation) -> None:
        out.add(AclBinding(principal(svc), res, name, pattern, op))

    for spec in TOPIC_SPECS:
        topic = names.name(spec.role)
        for svc in spec.writers:
            allow(svc, ResourceType.TOPIC, topic, PatternType.LITERAL, Operation.WRITE)
        for svc in spec.readers:
            allow(svc, ResourceType.TOPIC, topic, PatternType.LITERAL, Operation.READ)
            allow(svc, ResourceType.GROUP, group_prefix(prefix, svc), PatternType.PREFIXED,
                  Operation.READ)
    own = streams_prefix(prefix)
    allow(Service.STREAMS, ResourceType.TOPIC, own, PatternType.PREFIXED, Operation.ALL)
    allow(Service.STREAMS, ResourceType.TRANSACTIONAL_ID, own, PatternType.PREFIXED,
          Operation.WRITE)
    allow(Service.STREAMS, ResourceType.TRANSACTIONAL_ID, own, PatternType.PREFIXED,
          Operation.DESCRIBE)
    allow(Service.METRICS, ResourceType.GROUP, f"{prefix}-", PatternType.PREFIXED,
          Operation.DESCRIBE)
    fences = group_prefix(prefix, Service.DECIDE)  # decide's fenced producers (``--group-id``)
    for op in (Operation.WRITE, Operation.DESCRIBE):
        allow(Service.DECIDE, ResourceType.TRANSACTIONAL_ID, fences, PatternType.PREFIXED, op)
    return tuple(sorted(out))


def may_write(service: Service, topic: str, prefix: str) -> bool:
    """Whether the ACLs let ``service`` produce to ``topic`` (for tests and the docs)."""
    return any(b.principal == principal(service) and b.resource is ResourceType.TOPIC
               and b.operation in (Operation.WRITE, Operation.ALL)
               and (b.name == topic if b.pattern is PatternType.LITERAL
                    else topic.startswith(b.name))
               for b in acl_bindings(prefix))


def render_acl_table(prefix: str = "tg") -> str:
    """The Markdown ACL table of docs/security-broker.md (a test keeps the doc in step)."""
    names = TopicNames(prefix)
    lines = ["| topic | written by | read by |", "|---|---|---|"]
    for spec in TOPIC_SPECS:
        lines.append(f"| `{names.name(spec.role)}` | "
                     f"{', '.join(f'`{s.value}`' for s in sorted(spec.writers))} | "
                     f"{', '.join(f'`{s.value}`' for s in sorted(spec.readers))} |")
    lines += ["", "Every rule the secured broker gets for the prefix "
              f"`{prefix}` (`trainguard dev kafka acls --prefix {prefix} --list`):", "", "```"]
    lines += [b.describe() for b in acl_bindings(prefix)]
    lines += ["```", ""]
    return "\n".join(lines)
