"""A 3-node cluster losing the leader of a job's partition while a producer sends steadily.

    .venv/bin/python -m bench.bench_failover [seconds] [rate]

A fresh 3-node cluster (``dev kafka start --brokers 3``; RF 3, min.insync.replicas 2) in a
temporary directory; one acks=all idempotent ``EventProducer`` sends ``rate`` step reports per
second of one job for ``seconds``; a third of the way in, the node leading the job's partition
is SIGKILLed. Prints the acknowledged, refused, lost (acknowledged but not on the log) and
duplicated counts, the ack latency before and after the kill, and the longest stall (the
failover as the producer sees it).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from tempfile import TemporaryDirectory

from aiokafka.admin import AIOKafkaAdminClient

from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import EventConsumer
from trainguard.bus.producer import EventProducer
from trainguard.dev.cluster import KafkaCluster
from trainguard.events.topics import TOPIC_SPECS, TopicNames, TopicRole
from trainguard.rules import synth


async def leader(cfg: KafkaConfig, topic: str, partition: int) -> int:
    admin = AIOKafkaAdminClient(**cfg.client_kwargs())
    await admin.start()
    try:
        (desc,) = await admin.describe_topics([topic])
        return int(next(p["leader"] for p in desc["partitions"]
                        if p["partition"] == partition))
    finally:
        await admin.close()


async def run(cluster: KafkaCluster, cfg: KafkaConfig, seconds: float, rate: float) -> None:
    task = TopicNames(cfg.topic_prefix).name(TopicRole.TASK)
    count = int(seconds * rate)
    ranks = 8
    events = list(synth.job_steps("job-failover", ranks, count // ranks + 1))[:count]
    acked: dict[str, float] = {}
    refused: list[str] = []
    sent_at: dict[str, float] = {}
    killed_at = 0.0
    loop = asyncio.get_running_loop()

    async def watch(event_id: str, fut: asyncio.Future[object]) -> None:
        try:
            await fut
            acked[event_id] = loop.time()
        except Exception:
            refused.append(event_id)

    async with EventProducer(cfg, request_timeout_ms=60_000) as producer:
        first = await producer.send(events[0])
        sent_at[events[0].event_id] = acked[events[0].event_id] = loop.time()
        partition = first.partition
        t0 = loop.time()
        watchers = []
        for i, ev in enumerate(events[1:], 1):
            if i == count // 3:
                victim = await leader(cfg, task, partition)
                killed_at = loop.time()
                await asyncio.to_thread(cluster.kill_node, victim)
                print(f"killed node {victim} (leader of {task}/{partition}) at "
                      f"{killed_at - t0:.1f} s")
            await asyncio.sleep(max(0.0, t0 + i / rate - loop.time()))
            sent_at[ev.event_id] = loop.time()
            watchers.append(asyncio.ensure_future(watch(ev.event_id,
                                                        await producer.enqueue(ev))))
        await asyncio.gather(*watchers)
    consumer = EventConsumer(cfg, [TopicRole.TASK], group_id=None, name="failover-check",
                             dlq=None)
    await consumer.start()
    try:
        on_log = Counter(d.event.event_id for d in await consumer.drain(idle_ms=2000,
                                                                        limit_s=60))
    finally:
        await consumer.stop()
    before = [acked[e] - sent_at[e] for e in acked if sent_at[e] < killed_at]
    after = [acked[e] - sent_at[e] for e in acked if sent_at[e] >= killed_at]
    lost = [e for e in acked if on_log[e] == 0]
    print(f"events {count}: acknowledged {len(acked)}, refused {len(refused)}, "
          f"lost {len(lost)}, duplicated {sum(1 for n in on_log.values() if n > 1)}")
    for name, lat in (("before the kill", before), ("after the kill", after)):
        if lat:
            q = statistics.quantiles(lat, n=100) if len(lat) > 1 else [lat[0]] * 99
            print(f"ack latency {name}: p50 {q[49] * 1000:.0f} ms, p99 {q[98] * 1000:.0f} ms, "
                  f"max {max(lat) * 1000:.0f} ms")


def main() -> int:
    args = sys.argv[1:]
    seconds = float(args[0]) if args else 30.0
    rate = float(args[1]) if len(args) > 1 else 200.0
    with TemporaryDirectory(prefix="tg-bench-cluster-") as tmp:
        cluster = KafkaCluster(Path(tmp), size=3)
        t = time.monotonic()
        info = cluster.start(fresh=True, timeout_s=240)
        print(f"3-node cluster ready in {time.monotonic() - t:.1f} s: {info.bootstrap}")
        try:
            cfg = info.client_config(topic_prefix=f"f{uuid.uuid4().hex[:8]}")
            asyncio.run(ensure_topics(cfg, partitions={s.role: 3 for s in TOPIC_SPECS}))
            asyncio.run(run(cluster, cfg, seconds, rate))
        finally:
            cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
