"""``Bus.lease`` on Kafka: a member of a consumer group on one topic that reads nothing.

The group coordinator gives each partition of the topic to exactly one live member; this
member pauses every partition it is given (it fetches no records) and keeps polling so that it
stays in the group. ``held()`` is what the coordinator gave it, empty from the moment a
rebalance takes its partitions back (``on_partitions_revoked`` runs before the new assignment
is made, so two members never both believe they hold a partition after a clean hand-over).

A member that stops answering (killed, paused, cut off) keeps believing it holds its partitions
until it hears otherwise, while the others take them over after ``session_timeout_ms``. What a
service does with a lease must therefore be safe to do twice for a moment (decide's commands
are: their event id and idempotency key are derived from what they answer, and the actuator
acts on a key once).

The key's partition is the producer's (``aiokafka``'s default partitioner: murmur2 of the key),
over the topic's partitions as the broker's metadata gives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.partitioner import murmur2

from trainguard.bus.config import KafkaConfig

log = logging.getLogger(__name__)

SESSION_TIMEOUT_MS = 10_000  # a member that stops answering loses its partitions after this
HEARTBEAT_MS = 1_000


def key_partition(key: bytes, partitions: int) -> int:
    """The partition the producer writes ``key`` to (aiokafka's and Java's default)."""
    return int(murmur2(key) & 0x7FFFFFFF) % partitions


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, lease: KafkaLease) -> None:
        self.lease = lease

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        self.lease._held = frozenset()
        if revoked:
            log.warning("%s: gave up partitions %s", self.lease.name,
                        sorted(tp.partition for tp in revoked))

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        consumer = self.lease._consumer
        if assigned:
            consumer.pause(*assigned)
        self.lease._held = frozenset(tp.partition for tp in assigned)
        log.warning("%s: holds partitions %s", self.lease.name, sorted(self.lease._held))


class KafkaLease:
    def __init__(self, config: KafkaConfig, topic: str, *, group_id: str, name: str,
                 session_timeout_ms: int = SESSION_TIMEOUT_MS) -> None:
        self.topic = topic
        self.name = name
        kwargs = {**config.client_kwargs(), "client_id": f"{config.client_id}-{name}"}
        self._consumer = AIOKafkaConsumer(
            **kwargs, group_id=group_id, enable_auto_commit=False,
            session_timeout_ms=session_timeout_ms, heartbeat_interval_ms=HEARTBEAT_MS)
        self._held: frozenset[int] = frozenset()
        self._partitions = 0
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        try:
            await self._consumer.start()
            self._consumer.subscribe([self.topic], listener=_Listener(self))
        except BaseException:
            await self._consumer.stop()
            raise
        self._task = asyncio.create_task(self._stay(), name=f"{self.name}-lease")

    async def _stay(self) -> None:
        """Poll (every partition paused: nothing is fetched) so the member stays in the group
        and rebalances run."""
        while True:
            try:
                await self._consumer.getmany(timeout_ms=500)
            except Exception as exc:  # a broker away: keep trying, or the member drops out
                log.warning("%s: poll failed, retrying: %s", self.name, exc)
                await asyncio.sleep(1.0)

    async def stop(self) -> None:
        self._held = frozenset()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._consumer.stop()  # leaves the group: the others rebalance at once

    def held(self) -> frozenset[int]:
        return self._held

    def holds(self, key: bytes) -> bool:
        return bool(self._held) and self.partition(key) in self._held

    def partition(self, key: bytes) -> int | None:
        if not self._partitions:  # known once the group gave this member partitions
            self._partitions = len(self._consumer.partitions_for_topic(self.topic) or ())
        return key_partition(key, self._partitions) if self._partitions else None
