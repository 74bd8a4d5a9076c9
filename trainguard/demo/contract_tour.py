"""Stage-one demo: the event contract on a real broker, bad input included.

Publishes one event of every type with a malformed record among them, reads the log back
through the validating consumer and shows where the bad record went and why.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import EventConsumer
from trainguard.bus.dlq import DeadLetter
from trainguard.bus.producer import EventProducer
from trainguard.events.samples import sample_events
from trainguard.events.topics import EVENT_ROLES, TOPIC_SPECS, TopicNames, TopicRole

MALFORMED = (b'{"event_id":"bad00001","type":"step.report","schema_version":2,"job_id":"job-demo",'
             b'"subject":{"rank":1},"event_time":1,"source":"demo","payload":{"rank":1,'
             b'"world_size":4,"step":7,"samples_consumed":224,"compute_ms":"fast"}}')


async def contract_tour(cfg: KafkaConfig) -> dict[str, object]:
    names = TopicNames(cfg.topic_prefix)
    await ensure_topics(cfg, names, partitions={s.role: 3 for s in TOPIC_SPECS})
    events = sample_events()
    async with EventProducer(cfg, names) as producer:
        half = len(events) // 2
        for ev in events[:half]:
            await producer.send(ev)
        await producer.send_raw(names.name(TopicRole.TASK), MALFORMED, key=b"job-demo")
        for ev in events[half:]:
            await producer.send(ev)
        consumer = EventConsumer(cfg, list(EVENT_ROLES),
                                 group_id=None, name="demo", dlq=producer, names=names)
        await consumer.start()
        try:
            delivered = await consumer.drain()
        finally:
            await consumer.stop()
    from aiokafka import AIOKafkaConsumer

    dlq = AIOKafkaConsumer(names.name(TopicRole.DLQ), **cfg.client_kwargs(),
                           auto_offset_reset="earliest", group_id=None)
    await dlq.start()
    try:
        got = await dlq.getmany(timeout_ms=5000)
        letters = [DeadLetter.decode(r.value) for recs in got.values() for r in recs]
    finally:
        await dlq.stop()
    return {
        "published": len(events) + 1,
        "delivered_by_type": dict(Counter(d.event.type for d in delivered)),
        "dead_letters": [{"field": dl.field, "value": dl.value, "reason": dl.reason,
                          "from": f"{dl.source_topic}:{dl.source_partition}@{dl.source_offset}"}
                         for dl in letters],
    }


def run(cfg: KafkaConfig) -> dict[str, object]:
    return asyncio.run(contract_tour(cfg))
