"""Detection latency through the real pipeline: event time of a process exit -> the verdict
readable on the bus (a read-committed consumer receives it), p50/p99 over several jobs, with a
steady background of step reports from every job and, optionally, a fleet's node telemetry at
1 Hz flowing through the same worker.

    .venv/bin/python -m bench.bench_detection [--jobs 8] [--ranks 16] [--nodes 0] [--gpus 8]
                                              [--no-prompt] [--lanes both|urgent|task]
                                              [-- worker options...]

``--lanes both`` (the default) runs two workers one after the other on the same broker and load:
exits with their urgent copies (the agents' way), then exits on the task topic only (before
the urgent lane), and prints both lines and their ratio.

``--nodes 2048 --gpus 8`` is the issue's fleet (2,048 node records a second, 16,384 GPU
samples); the records are generated before the run (distinct ids, event times on the run's
clock) so generating them does not compete with the worker. The worker runs with its
defaults (prompt lane on) unless ``--no-prompt``. Also printed: whether the worker kept up with
the fleet (records left unconsumed by the evaluate agent at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from aiokafka import AIOKafkaConsumer

from bench._common import bench_broker
from bench.fleet import fleet_records
from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.bus.producer import EventProducer
from trainguard.events import decode, encode, partition_key
from trainguard.events.clock import now_us
from trainguard.events.payloads import Verdict, VerdictKind
from trainguard.events.topics import TOPIC_SPECS, TopicNames, TopicRole
from trainguard.rules import synth

STEP_S = 0.1
EXIT_AFTER_S = 3.0  # the first exit, after the load runs
EXIT_EVERY_S = 0.5
TAIL_S = 4.0


class VerdictWatch:
    """A read-committed consumer in its own thread: wall time each exit verdict was received."""

    def __init__(self, cfg: KafkaConfig) -> None:
        self.cfg = cfg
        self.seen: dict[str, int] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    async def _run(self) -> None:
        consumer = AIOKafkaConsumer(TopicNames(self.cfg.topic_prefix).name(TopicRole.VERDICTS),
                                    **self.cfg.client_kwargs(), group_id=None,
                                    auto_offset_reset="earliest",
                                    isolation_level="read_committed")
        await consumer.start()
        try:
            while not self.stop.is_set():
                for recs in (await consumer.getmany(timeout_ms=50)).values():
                    got = now_us()
                    for r in recs:
                        ev = decode(r.value)
                        if isinstance(ev.payload, Verdict) and (
                                ev.payload.kind is VerdictKind.PROCESS_EXIT):
                            self.seen.setdefault(ev.job_id, got)
        finally:
            await consumer.stop()


async def fleet_load(cfg: KafkaConfig, records: list[list[tuple[bytes, bytes]]],
                     t_start: float) -> int:
    """Publish second s's records at t_start + s (node-keyed telemetry, like the agents)."""
    from aiokafka import AIOKafkaProducer

    from trainguard.bus.producer import PRODUCER_SETTINGS

    topic = TopicNames(cfg.topic_prefix).name(TopicRole.TELEMETRY)
    producer = AIOKafkaProducer(**cfg.client_kwargs(), **{**PRODUCER_SETTINGS, "linger_ms": 5},
                                max_batch_size=1 << 20, max_request_size=8 << 20)
    await producer.start()
    sent = 0
    try:
        for s, second in enumerate(records):
            await asyncio.sleep(max(0.0, t_start + s - time.monotonic()))
            futs = [await producer.send(topic, value=v, key=k) for k, v in second]
            await asyncio.gather(*futs)
            sent += len(second)
    finally:
        await producer.stop()
    return sent


async def drive(cfg: KafkaConfig, jobs: int, ranks: int, seconds: float,
                urgent: bool = True) -> tuple[dict[str, int], dict[str, int]]:
    """Real-time step reports for every job (every ``STEP_S``); job j's last rank exits
    ``EXIT_AFTER_S + j * EXIT_EVERY_S`` after the start; then ``TAIL_S`` more of reports.
    ``urgent=False``: the exits go to the task topic only (no urgent copy), as before the
    urgent lane. Returns each exit's event time and when the broker acknowledged it."""
    exits: dict[str, int] = {}
    acked: dict[str, int] = {}
    async with EventProducer(cfg) as producer:
        t_begin = time.monotonic()
        step = 0
        while time.monotonic() - t_begin < seconds:
            t = now_us()
            futs = []
            for j in range(jobs):
                job = f"job-{j}"
                due = time.monotonic() - t_begin >= EXIT_AFTER_S + j * EXIT_EVERY_S
                for r in range(ranks):
                    if r == ranks - 1 and job in exits:
                        continue
                    futs.append(await producer.enqueue(
                        synth.step_report(job, r, step, t + r, 100.0, world=ranks)))
                if due and job not in exits:
                    t_exit = now_us()
                    exits[job] = t_exit
                    ev = synth.process_exit(job, "node-0", ranks - 1, t_exit, signal=9)
                    if urgent:
                        fut = await producer.enqueue(ev)
                        fut.add_done_callback(lambda _, job=job: acked.setdefault(job, now_us()))
                        futs.append(fut)
                    else:
                        await producer.send_raw(producer.topic_for(ev), encode(ev),
                                                key=partition_key(ev))
                        acked[job] = now_us()
            await asyncio.gather(*futs)
            step += 1
            await asyncio.sleep(max(0.0, t_begin + step * STEP_S - time.monotonic()))
    return exits, acked


async def probe(cfg: KafkaConfig, watch: VerdictWatch, limit_s: float = 180.0) -> float:
    """Wait until the worker answers: a probe job's exit verdict is readable (its reports go
    on, so an ordered-only worker's watermark passes the exit too). Returns the seconds."""
    t0 = time.monotonic()
    async with EventProducer(cfg) as producer:
        t = now_us()
        await (await producer.enqueue(synth.process_exit("probe", "node-0", 0, t, signal=9)))
        i = 0
        while "probe" not in watch.seen:
            if time.monotonic() - t0 > limit_s:
                raise SystemExit(f"the streams worker did not answer within {limit_s:.0f} s")
            await (await producer.enqueue(synth.step_report("probe", 1, i, now_us(), 1.0)))
            i += 1
            await asyncio.sleep(0.5)
    return time.monotonic() - t0


async def run(cfg: KafkaConfig, args: argparse.Namespace, seconds: float,
              fleet: list[list[tuple[bytes, bytes]]], urgent: bool
              ) -> tuple[dict[str, int], dict[str, int], int]:
    t_start = time.monotonic()
    load = asyncio.create_task(fleet_load(cfg, fleet, t_start)) if fleet else None
    exits, acked = await drive(cfg, args.jobs, args.ranks, seconds, urgent)
    sent = await load if load is not None else 0
    return exits, acked, sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--ranks", type=int, default=16)
    ap.add_argument("--nodes", type=int, default=0, help="fleet nodes at 1 Hz (0: none)")
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--no-prompt", action="store_true")
    ap.add_argument("--lanes", choices=["both", "urgent", "task"], default="both",
                    help="exits copied to the urgent topic, on the task topic only (as before "
                         "the urgent lane), or both side by side (default)")
    ap.add_argument("--batch-size", type=int, help="the worker's --batch-size")
    ap.add_argument("worker_args", nargs="*", help="after --: more `trainguard streams` options")
    args = ap.parse_args()
    if args.worker_args and "--" not in sys.argv:  # `8 16` is not --jobs 8 --ranks 16
        ap.error(f"unrecognized arguments: {' '.join(args.worker_args)} (worker options go "
                 "after --)")
    seconds = EXIT_AFTER_S + args.jobs * EXIT_EVERY_S + TAIL_S
    fleet: list[list[tuple[bytes, bytes]]] = []
    if args.nodes:
        t0 = now_us()  # fleet event times: their own job, its own watermark
        n = int(seconds) + 1
        flat = list(fleet_records(args.nodes, args.gpus, n, t0))
        fleet = [flat[s * args.nodes:(s + 1) * args.nodes] for s in range(n)]
    lanes = [True, False] if args.lanes == "both" else [args.lanes == "urgent"]
    results: dict[bool, list[float]] = {}
    with bench_broker() as info:
        for urgent in lanes:
            ready, exits, acked, seen, sent = measure(info.bootstrap, args, seconds, fleet,
                                                      urgent)
            results[urgent] = report(args, ready, exits, seen, sent, urgent)
            acks = sorted((acked[j] - t) / 1000 for j, t in exits.items() if j in acked)
            after = sorted((seen[j] - acked[j]) / 1000 for j in exits if j in seen and j in acked)
            if acks and after:
                print(f"  of which: event time -> acked by the broker p50 "
                      f"{statistics.median(acks):.0f} ms, max {acks[-1]:.0f} ms; acked -> "
                      f"verdict readable p50 {statistics.median(after):.0f} ms, "
                      f"max {after[-1]:.0f} ms")
    if len(results) == 2 and results[True] and results[False]:
        (p50u, p99u, nu), (p50t, p99t, nt) = results[True], results[False]
        print(f"urgent lane vs task topic only, same run: verdicts seen {nu:.0f} vs {nt:.0f} of "
              f"{args.jobs}; p50 {p50u:.0f} vs {p50t:.0f} ms; p99 {p99u:.0f} vs {p99t:.0f} ms, "
              f"ratio {p99u / p99t:.2f} (percentiles of the verdicts seen only)")


def measure(bootstrap: str, args: argparse.Namespace, seconds: float,
            fleet: list[list[tuple[bytes, bytes]]], urgent: bool
            ) -> tuple[float, dict[str, int], dict[str, int], dict[str, int], int]:
    """One worker on fresh topics: (probe seconds, exit times, their acks, verdict times,
    fleet records sent)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg = KafkaConfig(bootstrap=bootstrap, topic_prefix=f"bd{uuid.uuid4().hex[:6]}")
        asyncio.run(ensure_topics(cfg, partitions={s.role: 3 for s in TOPIC_SPECS}))
        cmd = [sys.executable, "-m", "trainguard.cli.main", "streams", "--bootstrap",
               bootstrap, "--prefix", cfg.topic_prefix, "--data-dir", f"{tmp}/w"]
        if args.no_prompt:
            cmd.append("--no-prompt")
        if args.batch_size:
            cmd += ["--batch-size", str(args.batch_size)]
        cmd += args.worker_args
        worker = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        watch = VerdictWatch(cfg)
        watch.thread.start()
        try:
            ready = asyncio.run(probe(cfg, watch))
            exits, acked, sent = asyncio.run(run(cfg, args, seconds, fleet, urgent))
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and len(watch.seen) < len(exits):
                time.sleep(0.2)
        finally:
            watch.stop.set()
            watch.thread.join(10)
            worker.terminate()
            try:
                worker.wait(30)
            except subprocess.TimeoutExpired:  # busy with a backlog: no clean stop needed
                worker.kill()
                worker.wait(10)
    return ready, exits, acked, dict(watch.seen), sent


def report(args: argparse.Namespace, ready: float, exits: dict[str, int],
           seen: dict[str, int], sent: int, urgent: bool) -> list[float]:
    """Print one mode's line; returns [p50 ms, p99 ms, verdicts seen] (empty: none seen)."""
    lat = sorted((seen[j] - t) / 1000 for j, t in exits.items() if j in seen)
    load = (f"fleet {args.nodes} nodes x {args.gpus} GPUs at 1 Hz ({sent} records sent)"
            if args.nodes else "no fleet telemetry")
    mode = "ordered only (--no-prompt)" if args.no_prompt else "prompt lane"
    mode += ", exits copied to the urgent topic" if urgent else ", exits on the task topic only"
    if args.batch_size:
        mode += f", worker --batch-size {args.batch_size}"
    if args.worker_args:
        mode += f", worker {' '.join(args.worker_args)}"
    print(f"(worker answered the probe after {ready:.1f} s)")
    if not lat:
        print(f"no exit verdicts seen ({load}, {mode})")
        return []
    p99 = lat[min(len(lat) - 1, round(0.99 * (len(lat) - 1)))]
    p90 = lat[min(len(lat) - 1, round(0.90 * (len(lat) - 1)))]
    p50 = statistics.median(lat)
    print(f"process exit -> verdict readable (read_committed), {len(lat)}/{len(exits)} jobs x "
          f"{args.ranks} ranks at {1 / STEP_S:.0f} steps/s, {load}, {mode}: "
          f"p50 {p50:.0f} ms, p90 {p90:.0f} ms, p99 {p99:.0f} ms, max {lat[-1]:.0f} ms")
    return [p50, p99, float(len(lat))]


if __name__ == "__main__":
    main()
