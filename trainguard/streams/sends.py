"""Sends that commit with the record that caused them, and prompt commits.

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

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)


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


class CommitSoon:
    """Commit as soon as faust has acknowledged the batch just handled, instead of at the next
    tick of ``--commit-interval-s``: what the urgent lane decided becomes readable (its
    transaction commits) within a commit's round trip, not half an interval later.

    faust acknowledges a batch's records when the agent asks for the next batch, after the
    agent's body returns; ``request()`` (called at the end of the body) starts a task that
    runs once the agent has gone back to waiting. Requests while a commit runs are served by
    one more commit after it, so a storm of urgent batches costs at most one commit in flight
    and one waiting. A failed commit is logged and left to faust's timer, which commits the
    same offsets again."""

    def __init__(self, commit: Callable[[], Awaitable[object]]) -> None:
        self._commit = commit
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self.commits = 0  # commits started, for tests and logs

    def request(self) -> None:
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        again = True
        while again:
            await asyncio.sleep(0)  # the agent's batch is acknowledged by now
            self._again = False
            self.commits += 1
            try:
                await self._commit()
            except Exception as exc:  # the timer's commit takes the same offsets
                log.warning("streams: an urgent batch's prompt commit failed: %s: %s",
                            type(exc).__name__, exc)
            again = self._again
