"""The bus contract (tests/bus_contract.py) on the in-memory bus."""

from __future__ import annotations

import pytest

from tests.bus_contract import BusContract
from trainguard.bus.dlq import DeadLetter
from trainguard.bus.memory import MemoryBus
from trainguard.bus.protocol import Bus
from trainguard.events.topics import TopicRole

pytestmark = pytest.mark.unit


class TestMemoryBus(BusContract):
    @pytest.fixture
    def bus(self) -> MemoryBus:
        return MemoryBus(prefix="mem")

    def dead_letters(self, bus: Bus) -> list[DeadLetter]:
        assert isinstance(bus, MemoryBus)
        return [DeadLetter.decode(r.value or b"") for r in bus.records(TopicRole.DLQ)]
