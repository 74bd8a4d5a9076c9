"""Fleet load generator: realistic node telemetry records for N nodes x G GPUs.

Each record is what one node agent publishes per interval: G GPU samples, two NICs, G rank
processes, peer paths. Values drift per node and GPU around plausible H100 figures, seeded,
so runs are reproducible. Used by the streams benchmarks, and on its own:

    .venv/bin/python -m bench.fleet --nodes 2048 --gpus 8 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
import uuid
from collections.abc import Iterator

from bench._common import bench_broker
from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.events import Subject, encode, make_event, partition_key
from trainguard.events import payloads as p
from trainguard.events.envelope import Event
from trainguard.events.topics import TOPIC_SPECS, TopicNames, TopicRole


def node_record(node: int, gpus: int, seq: int, at_us: int, job_id: str,
                rng: random.Random) -> Event:
    base_temp = 55 + (node % 7)
    samples = [
        p.GpuSample(index=g, uuid=f"GPU-{node:05d}-{g}", model="NVIDIA H100 80GB HBM3",
                    temperature_c=round(base_temp + rng.gauss(0, 1.5), 1),
                    power_w=round(min(700.0, max(60.0, 520 + rng.gauss(0, 25))), 1),
                    power_limit_w=700.0, sm_util_pct=round(min(100.0, 92 + rng.random() * 8), 1),
                    mem_util_pct=round(40 + rng.random() * 20, 1),
                    fb_used_mib=61_000.0 + g, fb_total_mib=81_559.0,
                    sm_clock_mhz=1980.0, mem_clock_mhz=2619.0,
                    ecc_sbe_volatile=0, ecc_dbe_volatile=0, pcie_replay_count=0,
                    nvlink_links_up=18, nvlink_links_total=18)
        for g in range(gpus)
    ]
    nics = [p.NicSample(name=f"ib{i}", kind="infiniband", operstate="up", carrier=True,
                        carrier_changes=1, rx_bytes=seq * 10**9, tx_bytes=seq * 10**9,
                        rx_bytes_per_s=2.4e10 + rng.random() * 1e9, tx_bytes_per_s=2.4e10)
            for i in range(2)]
    procs = [p.ProcessSample(pid=10_000 + g, rank=node * gpus + g, job_id=job_id,
                             state=p.ProcessState.RUNNING, cpu_pct=100.0, rss_bytes=8 << 30,
                             threads=32) for g in range(gpus)]
    payload = p.NodeTelemetry(interval_ms=1000, seq=seq, gpus=samples, nics=nics,
                              processes=procs)
    return make_event(payload, event_id=uuid.UUID(int=rng.getrandbits(128)).hex, job_id=job_id,
                      event_time=at_us, source=f"agent@node-{node:05d}",
                      subject=Subject(node=f"node-{node:05d}"))


def fleet_records(nodes: int, gpus: int, seconds: int, t0_us: int, job_id: str = "job-fleet",
                  seed: int = 1) -> Iterator[tuple[bytes, bytes]]:
    """(key, value) of every record, second by second, node by node."""
    rng = random.Random(seed)
    for s in range(seconds):
        for n in range(nodes):
            ev = node_record(n, gpus, s, t0_us + s * 1_000_000 + n, job_id, rng)
            yield partition_key(ev), encode(ev)


async def publish(cfg: KafkaConfig, records: list[tuple[bytes, bytes]]) -> float:
    from aiokafka import AIOKafkaProducer

    from trainguard.bus.producer import PRODUCER_SETTINGS

    topic = TopicNames(cfg.topic_prefix).name(TopicRole.TELEMETRY)
    producer = AIOKafkaProducer(**cfg.client_kwargs(), **{**PRODUCER_SETTINGS, "linger_ms": 20},
                                max_batch_size=1 << 20, max_request_size=8 << 20)
    await producer.start()
    try:
        t0 = time.perf_counter()
        futs = [await producer.send(topic, value=v, key=k) for k, v in records]
        await asyncio.gather(*futs)
        return len(records) / (time.perf_counter() - t0)
    finally:
        await producer.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=3)
    args = ap.parse_args()
    t = time.perf_counter()
    records = list(fleet_records(args.nodes, args.gpus, args.seconds, 1_790_000_000_000_000))
    gen = len(records) / (time.perf_counter() - t)
    size = sum(len(v) for _, v in records) / len(records)
    with bench_broker() as info:
        cfg = KafkaConfig(bootstrap=info.bootstrap, topic_prefix=f"fleet{uuid.uuid4().hex[:6]}")
        asyncio.run(ensure_topics(cfg, partitions={s.role: 6 for s in TOPIC_SPECS}))
        rate = asyncio.run(publish(cfg, records))
    print(f"fleet: {args.nodes} nodes x {args.gpus} GPUs x {args.seconds} s = {len(records)} "
          f"records of {size:,.0f} B; generated {gen:,.0f} records/s; published {rate:,.0f} "
          f"records/s = {rate * args.gpus:,.0f} GPU samples/s "
          f"({rate / args.nodes:.1f}x a {args.nodes}-node fleet at 1 Hz)")


if __name__ == "__main__":
    main()
