"""Produce -> consume through a real broker: trainguard's validating consumer against a raw
aiokafka consumer decoding the same records with orjson, in one run.

    .venv/bin/python -m bench.bench_bus [N]
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

import orjson
from aiokafka import AIOKafkaConsumer

from bench._common import bench_broker
from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import EventConsumer
from trainguard.bus.producer import EventProducer
from trainguard.events import decode
from trainguard.events.samples import sample_events
from trainguard.events.topics import TOPIC_SPECS, TopicNames, TopicRole


async def run(bootstrap: str, n: int) -> None:
    cfg = KafkaConfig(bootstrap=bootstrap, topic_prefix=f"bench{uuid.uuid4().hex[:6]}")
    names = TopicNames(cfg.topic_prefix)
    await ensure_topics(cfg, names, partitions={s.role: 3 for s in TOPIC_SPECS})
    step = next(e for e in sample_events() if e.type == "step.report")
    events = [step.model_copy(update={"event_id": f"b{i:010d}", "job_id": f"job-{i % 8}"})
              for i in range(n)]
    async with EventProducer(cfg, names) as producer:
        t0 = time.perf_counter()
        futs = [await producer.enqueue(ev) for ev in events]
        await asyncio.gather(*futs)
        produce = n / (time.perf_counter() - t0)

        consumer = EventConsumer(cfg, [TopicRole.TASK], group_id=None, name="bench", dlq=producer,
                                 names=names, max_partition_fetch_bytes=8 << 20)
        await consumer.start()
        t0 = time.perf_counter()
        got = 0
        while got < n:
            got += len(await consumer.poll(timeout_ms=1000, max_records=5000))
        ours = n / (time.perf_counter() - t0)
        await consumer.stop()

    raw = AIOKafkaConsumer(names.name(TopicRole.TASK), **cfg.client_kwargs(), group_id=None,
                           auto_offset_reset="earliest", enable_auto_commit=False,
                           max_partition_fetch_bytes=8 << 20)
    await raw.start()
    t0 = time.perf_counter()
    got = 0
    while got < n:
        batches = await raw.getmany(timeout_ms=1000, max_records=5000)
        for recs in batches.values():
            for r in recs:
                orjson.loads(r.value)
            got += len(recs)
    baseline = n / (time.perf_counter() - t0)
    await raw.stop()
    assert decode(events[0].model_dump_json().encode()).event_id == events[0].event_id
    print(f"events: {n}  produce (acks=all, idempotent) {produce:,.0f}/s")
    print(f"consume+validate (EventConsumer) {ours:,.0f}/s   raw aiokafka+orjson {baseline:,.0f}/s"
          f"   ratio {ours / baseline:.2f}")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50_000
    with bench_broker() as info:
        asyncio.run(run(info.bootstrap, n))


if __name__ == "__main__":
    main()
