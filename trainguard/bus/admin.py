"""Create the registry's topics on a broker, with their partitions and retention; create the
ACLs of a secured broker."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from aiokafka.protocol.admin import CreateAclsRequest, DescribeAclsRequest

from trainguard.bus.acl import ALLOW, AclBinding, Operation, PatternType, ResourceType
from trainguard.bus.config import KafkaConfig
from trainguard.events.topics import SPEC_BY_ROLE, TOPIC_SPECS, TopicNames, TopicRole


@dataclass(frozen=True)
class TopicState:
    name: str
    partitions: int
    created: bool


async def ensure_topics(
    config: KafkaConfig,
    names: TopicNames | None = None,
    *,
    partitions: dict[TopicRole, int] | None = None,
    replication_factor: int | None = None,
) -> list[TopicState]:
    """Create every registered topic that is missing; report each topic's partitions.

    ``partitions`` overrides the registry's count per role (small local brokers, tests).
    Replicas: ``replication_factor``, else the config's, with its ``min.insync.replicas``.
    An existing topic is left as it is; its actual partition count is reported.
    """
    replicas = replication_factor or config.replication_factor
    names = names or TopicNames(config.topic_prefix)
    wanted = {
        names.name(s.role): (partitions or {}).get(s.role, s.partitions) for s in TOPIC_SPECS
    }
    admin = AIOKafkaAdminClient(**config.client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        new = [
            NewTopic(
                name=name,
                num_partitions=count,
                replication_factor=replicas,
                topic_configs={**SPEC_BY_ROLE[names.role_of(name)].configs(),
                               "min.insync.replicas": str(config.min_insync_replicas)},
            )
            for name, count in wanted.items()
            if name not in existing
        ]
        if new:
            try:
                await admin.create_topics(new)
            except TopicAlreadyExistsError:
                pass  # a concurrent creator won the race; the describe below tells the truth
        described = await _wait_for_leaders(admin, list(wanted), timeout_s=30.0)
        actual = {d["topic"]: len(d["partitions"]) for d in described}
        return [
            TopicState(name, actual.get(name, 0), name not in existing) for name in wanted
        ]
    finally:
        await admin.close()


async def _wait_for_leaders(admin: AIOKafkaAdminClient, topics: list[str],
                            timeout_s: float) -> list[Any]:
    """Describe the topics once every partition has a leader (new topics need a moment)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        described: list[Any] = await admin.describe_topics(topics)
        ready = all(d.get("error_code", 0) == 0 and d["partitions"]
                    and all(part.get("leader", -1) >= 0 for part in d["partitions"])
                    for d in described)
        if ready or loop.time() > deadline:
            return described
        await asyncio.sleep(0.2)


async def topic_configs(config: KafkaConfig, topic: str, *,
                        wait_s: float = 15.0) -> dict[str, str]:
    """The broker's view of one topic's configuration (for checks and `topics describe`). A
    topic just created may not be known yet to the broker asked (an error code, or no entries):
    asked again for up to ``wait_s``, then ``KafkaError`` naming the topic and Kafka's word."""
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    admin = AIOKafkaAdminClient(**config.client_kwargs())
    await admin.start()
    try:
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            res = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
            out: dict[str, str] = {}
            errors: list[str] = []
            for response in res:
                for resource in response.resources:
                    if resource[0]:  # (error_code, error_message, type, name, entries)
                        errors.append(f"error code {resource[0]} {resource[1] or ''}".strip())
                    for entry in resource[4]:
                        out[entry[0]] = entry[1]
            if out and not errors:
                return out
            if asyncio.get_running_loop().time() >= deadline:
                raise KafkaError(f"topic {topic}: describe configs: "
                                 f"{'; '.join(errors) or 'no configuration entries'}")
            await asyncio.sleep(0.5)
    finally:
        await admin.close()


async def topic_partitions(config: KafkaConfig, topic: str) -> int:
    """How many partitions ``topic`` has on the broker (0 if it does not exist)."""
    admin = AIOKafkaAdminClient(**config.client_kwargs())
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
        return sum(len(d["partitions"]) for d in described if d.get("error_code", 0) == 0)
    finally:
        await admin.close()


class _CreateAcls(CreateAclsRequest):  # type: ignore[misc]
    """CreateAcls with many creations in one request (aiokafka's builds one)."""

    def __init__(self, bindings: Sequence[AclBinding]) -> None:
        self._bindings = list(bindings)

    def build(self, request_struct_class: Any) -> Any:
        if request_struct_class.API_VERSION < 1:  # pre-2.0 brokers: no prefixed patterns
            raise KafkaError("the broker does not support prefixed ACLs (CreateAcls v1)")
        return request_struct_class([
            (int(b.resource), b.name, int(b.pattern), b.principal, "*", int(b.operation),
             ALLOW) for b in self._bindings])


async def apply_acls(config: KafkaConfig, bindings: Sequence[AclBinding],
                     timeout_s: float = 30.0) -> None:
    """Create ``bindings`` (ALLOW, any host) on the broker; ``config`` must be a super user.

    Creating an ACL that exists is a no-op on the broker, so this is idempotent."""
    admin = AIOKafkaAdminClient(**config.client_kwargs())
    await admin.start()
    try:
        response = await admin._send_to_controller(_CreateAcls(bindings))
        failed = [(b.describe(), code, msg) for b, (code, msg)
                  in zip(bindings, response.creation_responses, strict=True) if code != 0]
        if failed:
            raise KafkaError(f"creating ACLs failed: {failed[:3]}")
        # The controller has them; every broker applies them a moment later. Return once the
        # broker answers with all of them, so a client started next is judged by them.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not set(bindings) <= await _described_acls(admin):
            if loop.time() > deadline:
                raise KafkaError(f"the broker did not show the new ACLs in {timeout_s:.0f}s")
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def _described_acls(admin: AIOKafkaAdminClient) -> set[AclBinding]:
    """Every ALLOW rule the broker holds (DescribeAcls with a match-anything filter)."""
    any_ = 1
    response = await admin._send_request(
        DescribeAclsRequest(any_, None, any_, None, None, any_, any_))
    if response.error_code:
        raise KafkaError(f"describing ACLs failed: {response.error_message}")
    out: set[AclBinding] = set()
    for res_type, name, pattern, acls in response.resources:
        for who, _host, operation, permission in acls:
            if permission == ALLOW:
                try:
                    out.add(AclBinding(who, ResourceType(res_type), name,
                                       PatternType(pattern), Operation(operation)))
                except ValueError:
                    continue  # a kind of rule this module never creates
    return out


async def check_transactions(config: KafkaConfig, transactional_id: str,
                             timeout_s: float = 30.0) -> str | None:
    """Why this principal cannot use ``transactional_id`` (None if it can).

    faust opens its exactly-once transactions lazily and, when the broker refuses one, only
    logs a warning and sends without a transaction: a worker must find out before it starts."""
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(**config.client_kwargs(), transactional_id=transactional_id)
    try:
        await asyncio.wait_for(producer.start(), timeout_s)
    except KafkaError as exc:  # TransactionalIdAuthorizationFailed among them
        return f"{type(exc).__name__} for transactional id {transactional_id!r}"
    except TimeoutError:
        return f"no transaction coordinator answered in {timeout_s:.0f}s"
    finally:
        await producer.stop()
    return None
