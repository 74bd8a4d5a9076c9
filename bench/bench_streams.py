"""One streams worker's throughput on node-batched telemetry from the fleet generator, against
a raw aiokafka consumer decoding the same records in the same run.

    .venv/bin/python -m bench.bench_streams [nodes] [seconds] [--pure-too] [-- worker options...]

Options after ``--`` go to ``trainguard streams`` (e.g. ``-- --commit-interval-s 1``).

Samples are GPU samples (8 per node record). The worker is timed from the evaluate agent's first
committed offset to the last (faust commits in exactly-once transactions), so start-up is not
counted. ``--pure-too``: first the same with the worker's rules run as pure Python
(``TRAINGUARD_PURE=1``; trainguard/rules/native.py), side by side.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid

import orjson
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from bench._common import bench_broker
from bench.fleet import fleet_records, publish
from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.dev.kafka import BrokerInfo
from trainguard.events.topics import TOPIC_SPECS, TopicNames, TopicRole
from trainguard.rules import native

GPUS = 8


async def committed(cfg: KafkaConfig, group: str, topic: str) -> int:
    admin = AIOKafkaAdminClient(**cfg.client_kwargs())
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
        return sum(m.offset for tp, m in offsets.items() if tp.topic == topic and m.offset > 0)
    except KafkaError:  # the worker's group does not exist yet
        return 0
    finally:
        await admin.close()


async def raw_rate(cfg: KafkaConfig, topic: str, n: int) -> float:
    consumer = AIOKafkaConsumer(topic, **cfg.client_kwargs(), group_id=None,
                                auto_offset_reset="earliest", max_partition_fetch_bytes=8 << 20)
    await consumer.start()
    try:
        t0, got = time.perf_counter(), 0
        while got < n:
            for recs in (await consumer.getmany(timeout_ms=1000, max_records=5000)).values():
                for r in recs:
                    orjson.loads(r.value)
                got += len(recs)
        return n / (time.perf_counter() - t0)
    finally:
        await consumer.stop()


def worker_rate(info: BrokerInfo, records: list[tuple[bytes, bytes]], tmp: str, extra: list[str],
                env: dict[str, str]) -> tuple[float, float] | None:
    """(worker records/s, raw records/s) on the records, published under a prefix of their
    own; None when the worker committed nothing."""
    n = len(records)
    cfg = KafkaConfig(bootstrap=info.bootstrap, topic_prefix=f"bs{uuid.uuid4().hex[:6]}")
    asyncio.run(ensure_topics(cfg, partitions={s.role: 3 for s in TOPIC_SPECS}))
    asyncio.run(publish(cfg, records))
    topic = TopicNames(cfg.topic_prefix).name(TopicRole.TELEMETRY)
    raw = asyncio.run(raw_rate(cfg, topic, n))
    # The evaluate agent's committed offsets on the telemetry topic (transaction markers
    # take no offsets there: the records were published without a transaction).
    evaluated = topic
    app_id = f"{cfg.topic_prefix}-streams"
    worker = subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli.main", "streams", "--bootstrap",
         info.bootstrap, "--prefix", cfg.topic_prefix, "--data-dir",
         f"{tmp}/{cfg.topic_prefix}", *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        first_t = first = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            done = asyncio.run(committed(cfg, app_id, evaluated))
            if done and first is None:
                first, first_t = done, time.monotonic()
            if done >= n:
                break
            time.sleep(0.5)
        end_t = time.monotonic()
    finally:
        worker.terminate()
        worker.wait(30)
    if first is None or first_t is None:
        return None
    return (n - first) / max(end_t - first_t, 1e-9), raw


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    pure_too = "--pure-too" in argv  # also a worker whose rules run as pure Python
    argv = [a for a in argv if a != "--pure-too"]
    nodes = int(argv[0]) if argv else 256
    seconds = int(argv[1]) if len(argv) > 1 else 10
    records = list(fleet_records(nodes, GPUS, seconds, 1_790_000_000_000_000))
    n = len(records)
    modes = [("as built", dict(os.environ))]
    if pure_too:
        modes.insert(0, ("pure", {**os.environ, native.PURE_ENV: "1"}))
    print(f"rules: {native.mode()}")
    with bench_broker() as info, tempfile.TemporaryDirectory() as tmp:
        for label, env in modes:
            got = worker_rate(info, records, tmp, extra, env)
            if got is None:
                print(f"[{label}] streams worker committed nothing")
                continue
            rate, raw = got
            print(f"[{label}] {n} node records ({nodes} nodes x {GPUS} GPUs x {seconds} s): "
                  f"streams worker {rate:,.0f} records/s = {rate * GPUS:,.0f} samples/s; raw "
                  f"aiokafka+orjson {raw:,.0f} records/s = {raw * GPUS:,.0f} samples/s; "
                  f"ratio {rate / raw:.2f}")


if __name__ == "__main__":
    main()
