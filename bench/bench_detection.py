"""Detection latency through the real pipeline: event time of a process exit -> the verdict
on the bus (its broker append time), p50/p99 over several jobs, with a steady background of
step reports from every job.

    .venv/bin/python -m bench.bench_detection [jobs] [ranks]
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

from aiokafka import AIOKafkaConsumer

from bench._common import bench_broker
from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.bus.producer import EventProducer
from trainguard.events import decode
from trainguard.events.clock import now_us
from trainguard.events.payloads import Verdict
from trainguard.events.topics import TOPIC_SPECS, TopicNames, TopicRole
from trainguard.rules import synth

STEP_S = 0.1


async def drive(cfg: KafkaConfig, jobs: int, ranks: int, seconds: float) -> dict[str, int]:
    """Real-time step reports for every job; job j's last rank exits at a staggered time."""
    exits: dict[str, int] = {}
    async with EventProducer(cfg) as producer:
        t_end = time.monotonic() + seconds
        step = 0
        while time.monotonic() < t_end:
            t = now_us()
            futs = []
            for j in range(jobs):
                job = f"job-{j}"
                exit_step = 20 + 5 * j
                for r in range(ranks):
                    if r == ranks - 1 and step >= exit_step:
                        continue
                    futs.append(await producer.enqueue(
                        synth.step_report(job, r, step, t + r, 100.0, world=ranks)))
                if step == exit_step:
                    exits[job] = t
                    futs.append(await producer.enqueue(
                        synth.process_exit(job, "node-0", ranks - 1, t, signal=9)))
            await asyncio.gather(*futs)
            step += 1
            await asyncio.sleep(STEP_S)
    return exits


async def verdict_times(cfg: KafkaConfig) -> dict[str, int]:
    consumer = AIOKafkaConsumer(TopicNames(cfg.topic_prefix).name(TopicRole.VERDICTS),
                                **cfg.client_kwargs(), group_id=None,
                                auto_offset_reset="earliest", isolation_level="read_committed")
    await consumer.start()
    out: dict[str, int] = {}
    try:
        for recs in (await consumer.getmany(timeout_ms=5000)).values():
            for r in recs:
                ev = decode(r.value)
                if isinstance(ev.payload, Verdict) and ev.payload.kind == "process_exit":
                    out.setdefault(ev.job_id, r.timestamp * 1000)
    finally:
        await consumer.stop()
    return out


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    ranks = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    with bench_broker() as info, tempfile.TemporaryDirectory() as tmp:
        cfg = KafkaConfig(bootstrap=info.bootstrap, topic_prefix=f"bd{uuid.uuid4().hex[:6]}")
        asyncio.run(ensure_topics(cfg, partitions={s.role: 3 for s in TOPIC_SPECS}))
        worker = subprocess.Popen(
            [sys.executable, "-m", "trainguard.cli.main", "streams", "--bootstrap",
             info.bootstrap, "--prefix", cfg.topic_prefix, "--datadir", f"{tmp}/w"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(12)  # worker start-up and first assignment
            exits = asyncio.run(drive(cfg, jobs, ranks, seconds=2 + (20 + 5 * jobs) * STEP_S
                                      + 6))
            time.sleep(5)
            seen = asyncio.run(verdict_times(cfg))
        finally:
            worker.terminate()
            worker.wait(30)
    lat = sorted((seen[j] - t) / 1000 for j, t in exits.items() if j in seen)
    if not lat:
        print("no exit verdicts seen")
        return
    p99 = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]
    print(f"process exit -> verdict on the bus, {len(lat)}/{len(exits)} jobs x {ranks} ranks at "
          f"{1 / STEP_S:.0f} steps/s: p50 {statistics.median(lat):.0f} ms, p99 {p99:.0f} ms, "
          f"max {lat[-1]:.0f} ms")


if __name__ == "__main__":
    main()
