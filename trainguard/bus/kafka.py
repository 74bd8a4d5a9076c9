"""The real bus: Kafka through the existing ``EventProducer`` and ``EventConsumer``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import EventConsumer
from trainguard.bus.producer import EventProducer
from trainguard.bus.protocol import EventSink, EventSource
from trainguard.events.envelope import Event
from trainguard.events.topics import TopicNames, TopicRole


class KafkaBus:
    def __init__(self, config: KafkaConfig, **consumer_settings: Any) -> None:
        self.config = config
        self.names = TopicNames(config.topic_prefix)
        self._consumer_settings = consumer_settings

    def producer(self) -> EventProducer:
        return EventProducer(self.config, self.names)

    def consumer(self, roles: Sequence[TopicRole], *, group_id: str | None, name: str,
                 dlq: EventSink | None, from_offset: str = "earliest",
                 dedupe: bool = False) -> EventSource:
        if dlq is not None and not isinstance(dlq, EventProducer):
            raise TypeError(f"{name}: the dead-letter producer of a Kafka consumer is a Kafka "
                            f"producer (got {type(dlq).__name__})")
        return EventConsumer(self.config, roles, group_id=group_id, name=name, dlq=dlq,
                             names=self.names, from_offset=from_offset, dedupe=dedupe,
                             **self._consumer_settings)

    async def read(self, roles: Sequence[TopicRole]) -> list[Event]:
        from trainguard.incidents.source import read_topics  # the log source's reader

        return (await read_topics(self.config, roles)).events
