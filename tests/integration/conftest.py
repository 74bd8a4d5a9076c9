"""Integration tier: a real Apache Kafka broker, started once per test session.

Each test gets its own topic prefix (and so its own topics and consumer groups). A broker that
cannot start fails the tests that need it; it is never skipped.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import EventConsumer
from trainguard.dev.kafka import BrokerInfo, KafkaBroker
from trainguard.events.envelope import Event
from trainguard.events.topics import TOPIC_SPECS, TopicNames, TopicRole

T = TypeVar("T")


def arun(coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
    """Run a coroutine to completion, bounded: no integration wait is unbounded."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def read_events(kafka: KafkaConfig, roles: Sequence[TopicRole], *, idle_ms: int = 1000,
                limit_s: float = 30.0) -> list[Event]:
    """Every valid event now on ``roles``, read without a consumer group (partition order)."""
    async def go() -> list[Event]:
        consumer = EventConsumer(kafka, roles, group_id=None, name="test-reader", dlq=None)
        await consumer.start()
        try:
            return [d.event for d in await consumer.drain(idle_ms=idle_ms, limit_s=limit_s)]
        finally:
            await consumer.stop()

    return arun(go(), timeout_s=limit_s + 30)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    root: Path = tmp_path_factory.mktemp("kafka")
    broker = KafkaBroker(root)
    try:
        broker.start(fresh=True, timeout_s=120)
    except Exception as exc:
        pytest.fail(f"the real Kafka broker could not start: {exc}", pytrace=False)
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def broker_info(kafka_broker: KafkaBroker) -> BrokerInfo:
    info = kafka_broker.running()
    if info is None:  # a test stopped it and did not bring it back: start it again
        info = kafka_broker.start(timeout_s=120)
    return info


@pytest.fixture
def kafka(broker_info: BrokerInfo) -> KafkaConfig:
    """A config with a fresh topic prefix; the registry's topics exist, 3 partitions each."""
    cfg = KafkaConfig(bootstrap=broker_info.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}",
                      client_id="trainguard-test")
    arun(ensure_topics(cfg, TopicNames(cfg.topic_prefix),
                       partitions={s.role: 3 for s in TOPIC_SPECS}))
    return cfg
