"""``streams/sends.py``: a send goes in the transaction faust commits its source record's
offset with, whatever partition the send itself lands on."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from faust.transport.consumer import TransactionManager
from faust.types import TP
from hypothesis import given
from hypothesis import strategies as st

from trainguard.streams.sends import TransactionalSend

pytestmark = pytest.mark.unit


@dataclass
class Producer:
    sent: list[tuple[str, bytes | None, bytes, str | None]] = field(default_factory=list)

    async def send(self, topic: str, key: bytes | None, value: bytes, partition: int | None,
                   timestamp: float | None, headers: Any, *,
                   transactional_id: str | None = None) -> None:
        self.sent.append((topic, key, value, transactional_id))


def app(groups: dict[str, int]) -> Any:
    return SimpleNamespace(
        conf=SimpleNamespace(id="tg-streams"),
        assignor=SimpleNamespace(group_for_topic=groups.__getitem__,
                                 is_standby=lambda tp: False),
        producer=Producer())


@dataclass
class Committer:
    committed: list[str] = field(default_factory=list)

    async def commit_transactions(self, by_id: dict[str, Any], group_id: str, *,
                                  start_new_transaction: bool) -> None:
        self.committed += by_id


def faust_ids(the_app: Any, tp: TP) -> tuple[set[str], list[str]]:
    """The transactional ids faust's own manager starts a producer under for ``tp`` and
    commits ``tp``'s offsets under."""
    manager = object.__new__(TransactionManager)
    manager.app = the_app
    manager.producer = Committer()
    started: set[str] = manager._tps_to_transactional_ids({tp})
    asyncio.run(manager.commit({tp: 8}))
    return started, manager.producer.committed


@given(partition=st.integers(0, 4096), group=st.integers(0, 7),
       topic=st.sampled_from(["tg.task", "tg.telemetry", "tg.urgent", "tg.outcomes"]))
def test_a_send_uses_the_transaction_of_its_source_partition(partition: int, group: int,
                                                             topic: str) -> None:
    the_app = app({topic: group})
    source = SimpleNamespace(topic=topic, partition=partition, offset=7)
    asyncio.run(TransactionalSend(the_app)("tg.verdicts", b"job", b"v", source))
    [(dest, key, value, tid)] = the_app.producer.sent
    assert (dest, key, value) == ("tg.verdicts", b"job", b"v")
    assert faust_ids(the_app, TP(topic, partition)) == ({tid}, [tid])


def test_sources_on_other_partitions_use_other_transactions() -> None:
    the_app = app({"tg.task": 0})
    send = TransactionalSend(the_app)
    for p in (0, 1, 0):
        asyncio.run(send("tg.dlq", None, b"x", SimpleNamespace(topic="tg.task", partition=p)))
    tids = [tid for *_, tid in the_app.producer.sent]
    assert tids[0] == tids[2] != tids[1]
