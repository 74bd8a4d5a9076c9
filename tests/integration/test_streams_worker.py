"""`trainguard streams` on the real broker: located verdicts from the log, a worker killed
mid-run and started again neither misses nor repeats a verdict, and a job that sends only
node-level records (no task events) is evaluated straight from the telemetry topic."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

from aiokafka import AIOKafkaConsumer

from tests.integration.conftest import arun
from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import EventConsumer
from trainguard.bus.producer import EventProducer, stamp_ingest
from trainguard.events import decode, encode
from trainguard.events.clock import now_us
from trainguard.events.codec import partition_key
from trainguard.events.envelope import Event
from trainguard.events.payloads import NodeHealthKind, Verdict
from trainguard.events.registry import URGENT_TYPES
from trainguard.events.topics import TopicNames, TopicRole
from trainguard.rules import RuleEngine, load_default_rules, synth
from trainguard.rules.registry import EVALUATORS


def _scenario() -> list[Event]:
    slow = list(synth.job_steps("job-slow", 6, 90, base_ms=100.0, noise=0.05, seed=3,
                                slow={3: (20, 2.0)}))
    dead = list(synth.job_steps("job-dead", 6, 90, base_ms=80.0, noise=0.05, seed=4))
    exit_at = dead[6 * 45].event_time
    dead = [e for e in dead if not (e.subject.rank == 5 and e.event_time > exit_at)]
    dead.append(synth.process_exit("job-dead", "node-1", 5, exit_at + 5, exit_code=None,
                                   signal=9))
    events = sorted(slow + dead, key=lambda e: e.event_time)
    return events


def _expected(events: list[Event], *, copies_first: bool = False) -> dict[str, list[bytes]]:
    """What the worker must publish: its engines run the prompt lane (exits decided on
    arrival), and a job's records all arrive in publish order (one partition).
    ``copies_first``: every urgent copy is decided before any record of the log (the other
    extreme of the two agents' interleaving)."""
    rules = load_default_rules()
    out: dict[str, list[bytes]] = {}
    engines: dict[str, RuleEngine] = {}
    copies = [(True, e) for e in events if e.type in URGENT_TYPES] if copies_first else []
    for copy, ev in copies + [(False, e) for e in events]:
        engine = engines.setdefault(ev.job_id, RuleEngine(ev.job_id, rules, prompt=True))
        decided = engine.early(ev) if copy else engine.feed(ev)
        out.setdefault(ev.job_id, []).extend(encode(v) for v in decided)
    return out


def _no_commit_due(events: list[Event]) -> tuple[str, ...]:
    """Worker options under which no commit falls due for ten minutes, by time or by count."""
    return ("--commit-interval-s", "600", "--batch-size", str(10 * len(events)))


def _worker(kafka: KafkaConfig, datadir: Path, *extra: str) -> subprocess.Popen[bytes]:
    # stderr to a file beside its data dir: a pipe nobody reads fills up (every dead letter is
    # logged) and then blocks the worker, which then misses its commit before a stop
    datadir.parent.mkdir(parents=True, exist_ok=True)
    with (datadir.parent / f"{datadir.name}.stderr").open("wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "trainguard.cli.main", "streams", "--bootstrap",
             kafka.bootstrap, "--prefix", kafka.topic_prefix, "--data-dir", str(datadir),
             *extra],
            stdout=subprocess.DEVNULL, stderr=log)


# verdicts the prompt lane may open early: their place in the live sequence depends on when the
# urgent copy of their source came, against the backlog on its own topic (docs/rules.md)
PROMPT_KINDS = frozenset(k.value for cls in EVALUATORS.values() if cls.prompt_types
                         for k in cls.kinds)


def _assert_same_verdicts(got: list[Event], events: list[Event]) -> None:
    """Per job: none twice; everything but the prompt lane's opens byte for byte in the order
    the log gives; every verdict of that order, and besides those only what an urgent copy
    decided ahead of its original can decide (``copies_first``)."""
    expected, early = _expected(events), _expected(events, copies_first=True)
    live: dict[str, list[bytes]] = {}
    for v in got:
        live.setdefault(v.job_id, []).append(encode(v))
    for job, vs in live.items():
        assert len(vs) == len(set(vs)), f"{job}: a verdict published twice"
    assert set(live) == set(expected)
    for job, want in expected.items():
        assert set(want) <= set(live[job]) <= set(want) | set(early[job]), job

    def ordered(vs: list[bytes]) -> list[bytes]:
        out = []
        for raw in vs:
            v = decode(raw).payload
            assert isinstance(v, Verdict)
            if not (v.kind.value in PROMPT_KINDS and v.state.value == "open"):
                out.append(raw)
        return out
    assert {j: ordered(vs) for j, vs in live.items()} == {
        j: ordered(vs) for j, vs in expected.items()}


def _stop(worker: subprocess.Popen[bytes]) -> None:
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        worker.kill()


async def _publish(kafka: KafkaConfig, events: list[Event]) -> None:
    async with EventProducer(kafka) as producer:
        futs = [await producer.enqueue(ev) for ev in events]
        await asyncio.gather(*futs)


async def _verdicts(kafka: KafkaConfig, want: int, limit_s: float) -> list[Event]:
    consumer = EventConsumer(kafka, [TopicRole.VERDICTS], group_id=None, name="verdict-check",
                             dlq=None)
    await consumer.start()
    got: list[Event] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while loop.time() < deadline:
            got += [d.event for d in await consumer.poll(timeout_ms=1000)]
            if len(got) >= want:
                got += [d.event for d in await consumer.drain(idle_ms=2000, limit_s=10)]
                break
        return got
    finally:
        await consumer.stop()


def test_verdicts_survive_a_killed_worker_exactly_once(kafka: KafkaConfig,
                                                       tmp_path: Path) -> None:
    events = _scenario()
    expected = _expected(events)
    want = sum(len(v) for v in expected.values())
    assert want >= 2, expected
    half = len(events) // 2

    worker = _worker(kafka, tmp_path / "w1")
    try:
        arun(_publish(kafka, events[:half]))
        first = arun(_verdicts(kafka, 1, limit_s=90), timeout_s=120)
        assert first, "no verdict from the first worker"
        time.sleep(1.0)
    finally:
        worker.send_signal(signal.SIGKILL)  # mid-run, no clean shutdown
        worker.wait(10)
    arun(_publish(kafka, events[half:]))
    worker = _worker(kafka, tmp_path / "w2")
    try:
        got = arun(_verdicts(kafka, want, limit_s=120), timeout_s=150)
    finally:
        _stop(worker)

    _assert_same_verdicts(got, events)  # byte-identical, none missing, none twice

    kinds = {(v.job_id, v.payload.kind, v.subject.rank) for v in got
             if isinstance(v.payload, Verdict) and v.payload.state == "open"}
    assert ("job-slow", "straggler", 3) in kinds
    assert any(job == "job-dead" and rank == 5 for job, _kind, rank in kinds)


async def _publish_log_only(kafka: KafkaConfig, events: list[Event]) -> None:
    """As the agents publish, without the urgent copies (whose batches commit at once)."""
    async with EventProducer(kafka) as producer:
        for ev in events:
            await producer.send_raw(producer.topic_for(ev), encode(stamp_ingest(ev, now_us())),
                                    partition_key(ev))


async def _written(kafka: KafkaConfig, role: TopicRole, want: int, limit_s: float) -> int:
    """How many records ``role`` holds, committed or not (read uncommitted), once ``want``
    are there or ``limit_s`` has passed."""
    reader = AIOKafkaConsumer(TopicNames(kafka.topic_prefix).name(role), **kafka.client_kwargs(),
                              group_id=None, auto_offset_reset="earliest",
                              isolation_level="read_uncommitted")
    await reader.start()
    n = 0
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while n < want and loop.time() < deadline:
            n += sum(len(rs) for rs in (await reader.getmany(timeout_ms=500)).values())
        return n
    finally:
        await reader.stop()


def test_verdicts_commit_with_their_source_offsets(kafka: KafkaConfig, tmp_path: Path) -> None:
    """A verdict is written in the transaction that commits the offset of the record that
    decided it: before that commit no read-committed consumer sees it, and a worker killed
    before it leaves nothing behind; the next worker decides it again, once."""
    events = _scenario()
    want = sum(len(v) for v in _expected(events).values())
    # no commit for ten minutes: neither by time nor by count, nor an urgent batch's
    worker = _worker(kafka, tmp_path / "w1", *_no_commit_due(events))
    try:
        arun(_publish_log_only(kafka, events))
        written = arun(_written(kafka, TopicRole.VERDICTS, want, limit_s=90), timeout_s=120)
        assert written >= want, f"the worker wrote {written} of {want} verdicts"
        seen = arun(_verdicts(kafka, 1, limit_s=3), timeout_s=30)
        assert seen == [], f"{len(seen)} verdicts visible before their commit"
    finally:
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
    worker = _worker(kafka, tmp_path / "w2")
    try:
        got = arun(_verdicts(kafka, want, limit_s=120), timeout_s=150)
    finally:
        _stop(worker)
    _assert_same_verdicts(got, events)  # the killed worker's verdicts were aborted


def test_an_urgent_batch_commits_at_once(kafka: KafkaConfig, tmp_path: Path) -> None:
    """The urgent lane's verdict is readable without waiting for the commit interval: its
    batch commits as soon as faust has acknowledged it (``streams/sends.py``, CommitSoon)."""
    events = _scenario()
    worker = _worker(kafka, tmp_path / "w1", *_no_commit_due(events))
    try:
        arun(_publish(kafka, events))  # with the exit's urgent copy
        seen = arun(_verdicts(kafka, 1, limit_s=60), timeout_s=90)
    finally:
        _stop(worker)
    exits = [v for v in seen if isinstance(v.payload, Verdict)
             and v.payload.kind.value == "process_exit" and v.subject.rank == 5]
    assert exits, f"no process_exit verdict readable within 60 s: {len(seen)} verdicts"


def test_a_job_with_only_node_level_records_is_evaluated(kafka: KafkaConfig,
                                                         tmp_path: Path) -> None:
    # No task events at all (a job finished, or hung, while its nodes still report): the
    # job's telemetry partition alone carries it. A must-drain XID from the kernel log opens
    # a located verdict at once (prompt lane), and the worker keeps running.
    job = "job-quiet"
    t0 = now_us()
    events = [synth.telemetry(job, f"node-{i % 3}", t0 + i * 1000, i) for i in range(12)]
    events.append(synth.node_health(job, "node-1", NodeHealthKind.XID, t0 + 12_500, code=79,
                                    gpu=3))
    worker = _worker(kafka, tmp_path / "w")
    try:
        arun(_publish(kafka, events))
        got = arun(_verdicts(kafka, 1, limit_s=60), timeout_s=90)
        assert worker.poll() is None, "the worker exited"
    finally:
        _stop(worker)
    opened = [(v.job_id, v.payload.kind, v.subject.node, v.subject.gpu) for v in got
              if isinstance(v.payload, Verdict) and v.payload.state == "open"]
    assert opened == [(job, "xid_drain", "node-1", 3)]
