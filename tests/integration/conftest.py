"""Integration tier: a real Apache Kafka broker, started once per test session.

Each test gets its own topic prefix (and so its own topics and consumer groups). A broker that
cannot start fails the tests that need it; it is never skipped.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.dev.kafka import BrokerInfo, KafkaBroker
from trainguard.events.topics import TOPIC_SPECS, TopicNames

T = TypeVar("T")


def arun(coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
    """Run a coroutine to completion, bounded: no integration wait is unbounded."""
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


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
