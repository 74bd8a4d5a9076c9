"""Duplicates and losses of the agent's spool publisher across broker SIGKILLs.

A real broker (its own state dir), the spool and publisher in this process putting records at a
steady rate; the broker is SIGKILLed mid-produce ``--kills`` times and started again after
``--down-s``; at the end the topic is read back and every record counted: lost (never on the
topic), duplicated (the same bytes at two offsets).

    PYTHONPATH=$PWD python bench/bench_spool_broker_kill.py --kills 3
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from aiokafka import AIOKafkaConsumer

from trainguard.agent.metrics import AgentMetrics
from trainguard.agent.publisher import SpoolPublisher
from trainguard.agent.spool import DiskSpool
from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.dev.kafka import KafkaBroker
from trainguard.events.topics import TOPIC_SPECS, TopicNames, TopicRole


async def _produce(spool: DiskSpool, publisher: SpoolPublisher, topic: str, rate: int,
                   seconds: float, broker: KafkaBroker, kills: int, down_s: float) -> int:
    stop = asyncio.Event()
    runner = asyncio.create_task(publisher.run(stop))
    n = 0
    start = time.monotonic()
    kill_at = [seconds * (k + 1) / (kills + 1) for k in range(kills)]
    while time.monotonic() - start < seconds:
        for _ in range(rate // 100):
            rec = spool.put(topic, b"job", f"record {n:08d} ".encode() + b"x" * 200,
                            "step.report", int(time.time() * 1000))
            publisher.note_put(rec)
            n += 1
        if kill_at and time.monotonic() - start >= kill_at[0]:
            kill_at.pop(0)
            info = broker.running()
            assert info is not None
            os.kill(info.pid, signal.SIGKILL)
            print(f"SIGKILL broker at record {n}", file=sys.stderr)
            await asyncio.sleep(down_s)
            await asyncio.to_thread(broker.start, timeout_s=120)
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(runner, 300)
    return n


async def _read(cfg: KafkaConfig, topic: str) -> Counter[bytes]:
    consumer = AIOKafkaConsumer(topic, **cfg.client_kwargs(), group_id=None,
                                auto_offset_reset="earliest", enable_auto_commit=False)
    await consumer.start()
    seen: Counter[bytes] = Counter()
    try:
        while True:
            got = await consumer.getmany(timeout_ms=3000, max_records=10000)
            if not got:
                return seen
            for recs in got.values():
                seen.update(r.value for r in recs if r.value is not None)
    finally:
        await consumer.stop()


class _Unacked(logging.Handler):
    """Counts the publisher's failed sends (the records it then treats as uncertain)."""

    def __init__(self) -> None:
        super().__init__()
        self.episodes = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "records unacked" in record.getMessage():
            self.episodes += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=3)
    ap.add_argument("--rate", type=int, default=5000, help="records per second")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--down-s", type=float, default=1.0)
    args = ap.parse_args()
    unacked = _Unacked()
    logging.getLogger("trainguard.agent.publisher").addHandler(unacked)
    with tempfile.TemporaryDirectory(prefix="tg-spool-kill-") as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka")
        info = broker.start(fresh=True, timeout_s=120)
        try:
            cfg = KafkaConfig(bootstrap=info.bootstrap, topic_prefix="bk")
            asyncio.run(ensure_topics(cfg, TopicNames("bk"),
                                      partitions={s.role: 3 for s in TOPIC_SPECS}))
            topic = TopicNames("bk").name(TopicRole.TASK)
            spool = DiskSpool(Path(tmp) / "spool")
            publisher = SpoolPublisher(spool, cfg, AgentMetrics())  # the agent's settings
            n = asyncio.run(_produce(spool, publisher, topic, args.rate, args.seconds, broker,
                                     args.kills, args.down_s))
            seen = asyncio.run(_read(cfg, topic))
        finally:
            broker.stop()
    dups = sum(c - 1 for c in seen.values() if c > 1)
    print(f"put {n}; on the topic {sum(seen.values())} records, {len(seen)} distinct; "
          f"lost {n - len(seen)}; duplicates {dups}; reconciled {publisher.reconciled}; "
          f"{unacked.episodes} sends unacknowledged; {args.kills} broker SIGKILLs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
