"""Publishing events: the registry picks topic and key; acks=all with idempotence on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import ProducerFenced

from trainguard.bus.config import KafkaConfig
from trainguard.bus.errors import Fenced
from trainguard.events.clock import now_us
from trainguard.events.codec import encode, partition_key
from trainguard.events.envelope import Event
from trainguard.events.registry import BY_NAME
from trainguard.events.topics import TopicNames

PRODUCER_SETTINGS: dict[str, Any] = {
    "acks": "all",
    "enable_idempotence": True,
    "linger_ms": 5,
    "compression_type": None,
}


def stamp_ingest(event: Event, at_us: int) -> Event:
    """The event as it enters the pipeline: ``ingest_time`` set once, never overwritten."""
    if event.ingest_time is not None:
        return event
    return event.model_copy(update={"ingest_time": at_us})


class EventProducer:
    def __init__(self, config: KafkaConfig, names: TopicNames | None = None, **settings: Any):
        self.config = config
        self.names = names or TopicNames(config.topic_prefix)
        merged = {**PRODUCER_SETTINGS, **settings}
        self._producer = AIOKafkaProducer(**config.client_kwargs(), **merged)

    async def start(self) -> None:
        try:
            await self._producer.start()
        except BaseException:
            await self._producer.stop()  # a client that failed to start holds no connection
            raise

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> EventProducer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def topic_for(self, event: Event) -> str:
        return self.names.name(BY_NAME[event.type].topic)

    async def send(self, event: Event) -> Any:
        """Send and wait for the broker's acknowledgement; returns the record metadata."""
        fut = await self.enqueue(event)
        return await fut

    async def enqueue(self, event: Event) -> Any:
        """Hand the event to the client's batcher; the returned future resolves on ack."""
        event = stamp_ingest(event, now_us())
        value, key, ts = encode(event), partition_key(event), event.event_time // 1000
        fut = await self._producer.send(self.topic_for(event), value=value, key=key,
                                         timestamp_ms=ts)
        for copy in BY_NAME[event.type].topics[1:]:  # an urgent type's copy, same bytes
            await self._producer.send(self.names.name(copy), value=value, key=key,
                                      timestamp_ms=ts)
        return fut

    async def send_raw(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        """Bytes as they are: for the dead-letter topic and for tests of bad input."""
        fut = await self._producer.send(topic, value=value, key=key)
        return await fut

    async def flush(self) -> None:
        await self._producer.flush()


class FencedProducer(EventProducer):
    """``Bus.fenced_producer`` on Kafka: ``fence_id`` is the transactional id and each send is
    one transaction. ``start`` registers the id with the transaction coordinator, which bumps
    its epoch and so fences every producer started before with that id: the broker refuses
    their next write (and aborts their open transaction), and this class turns that into
    ``Fenced``, for that send and every later one."""

    def __init__(self, config: KafkaConfig, names: TopicNames | None, fence_id: str) -> None:
        super().__init__(config, names, transactional_id=fence_id)
        self.fence_id = fence_id
        self.fenced = False

    async def send(self, event: Event) -> Any:
        return await self._atomic(lambda: super(FencedProducer, self).enqueue(event))

    async def enqueue(self, event: Event) -> Any:
        """As ``send`` (the transaction is committed before it returns), for the Protocol."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        fut.set_result(await self.send(event))
        return fut

    async def send_raw(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        return await self._atomic(lambda: self._producer.send(topic, value=value, key=key))

    async def _atomic(self, hand_over: Callable[[], Awaitable[Any]]) -> Any:
        if self.fenced:
            raise Fenced(f"{self.fence_id}: fenced by a newer producer")
        fut: asyncio.Future[Any] | None = None
        try:
            async with self._producer.transaction():
                fut = await hand_over()
            return await fut  # resolved: the commit flushed it
        except ProducerFenced:
            self.fenced = True  # aiokafka's transaction state is fatal from here on
            if fut is not None:  # its record failed the same way: said here, not at exit
                fut.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise Fenced(f"{self.fence_id}: fenced by a newer producer") from None
