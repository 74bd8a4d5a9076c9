"""The bus contract (tests/bus_contract.py) on the real broker."""

from __future__ import annotations

import pytest

from tests.bus_contract import BusContract, run
from trainguard.bus.config import KafkaConfig
from trainguard.bus.dlq import DeadLetter
from trainguard.bus.kafka import KafkaBus
from trainguard.bus.protocol import Bus
from trainguard.events.topics import TopicRole

pytestmark = pytest.mark.integration


class TestKafkaBus(BusContract):
    @pytest.fixture
    def bus(self, kafka: KafkaConfig) -> KafkaBus:
        return KafkaBus(kafka)

    def dead_letters(self, bus: Bus) -> list[DeadLetter]:
        from aiokafka import AIOKafkaConsumer

        assert isinstance(bus, KafkaBus)

        async def go() -> list[DeadLetter]:
            consumer = AIOKafkaConsumer(bus.names.name(TopicRole.DLQ),
                                        **bus.config.client_kwargs(), group_id=None,
                                        auto_offset_reset="earliest")
            await consumer.start()
            try:
                batches = await consumer.getmany(timeout_ms=3000)
                return [DeadLetter.decode(r.value) for recs in batches.values() for r in recs]
            finally:
                await consumer.stop()

        return run(go())
