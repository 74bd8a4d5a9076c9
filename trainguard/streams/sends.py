"""Sends that commit with the record that caused them.

faust's exactly-once mode keeps one transactional producer per assigned partition (of each
co-partitioned topic group) and commits each one's open transaction together with the
offsets of its partition. It picks the producer for a send from the *destination*: the
partition the key hashes to, looked up in the consumer's metadata and the assignor's topic
groups. Topics the worker only writes (verdicts, dead letters) are in neither, so
``topic.send`` finds no partition for them and falls back to faust's plain producer: those
records were visible at once, outside any transaction. A worker killed after a send and
before its commit then read the record again from the old offset and sent it a second time
(with its state lost alongside, so the engine could not tell).

``TransactionalSend`` instead sends on the producer of the *source* record's partition, the
transaction that commits that record's offset. What it sent becomes visible with that offset
and is aborted with it. (A record whose offset faust has not acknowledged yet can still be
in a commit that holds the send: faust acknowledges a batch after the agent returns. A crash
in that gap, before the next commit, reads the record again: a verdict is then recognised
by the job's state, which committed in the same transaction, and a dead letter is written
again with the same source coordinates.)
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol


class Send(Protocol):
    """Write ``value`` under ``key`` to ``topic`` in the transaction of ``source`` (the
    faust message being processed: its ``topic`` and ``partition``)."""

    def __call__(self, topic: str, key: bytes | None, value: bytes,
                 source: Any) -> Awaitable[None]: ...


def transactional_id(app_id: str, group: int, partition: int) -> str:
    """faust's transactional id for partition ``partition`` of topic group ``group``: the
    producer it starts for that partition and commits the partition's offsets with
    (``TransactionManager.commit``)."""
    return f"{app_id}-{group}-{partition}"


class TransactionalSend:
    """``Send`` over a running faust app in exactly-once mode."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, topic: str, key: bytes | None, value: bytes,
                       source: Any) -> None:
        app = self.app
        tid = transactional_id(app.conf.id, app.assignor.group_for_topic(str(source.topic)),
                               int(source.partition))
        # enqueued in the open transaction; its commit waits for the delivery
        await app.producer.send(topic, key, value, None, None, None, transactional_id=tid)
