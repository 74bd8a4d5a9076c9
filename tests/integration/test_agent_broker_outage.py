"""The node agent across a real broker outage: stop Kafka mid-run, keep reporting, bring it
back. Every step report arrives exactly once and in order per rank."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

from tests.integration.conftest import arun
from trainguard.agent.metrics import AgentMetrics
from trainguard.agent.node_agent import AgentIdentity, NodeAgent
from trainguard.agent.publisher import SpoolPublisher
from trainguard.agent.spool import DiskSpool
from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import Delivered, EventConsumer
from trainguard.bus.producer import EventProducer
from trainguard.collectors.base import Discrete, Reading
from trainguard.dev.kafka import KafkaBroker
from trainguard.events.envelope import Subject
from trainguard.events.payloads import StepReport
from trainguard.events.topics import TopicNames, TopicRole

RANKS = 3


class SteppingJob:
    """Stands in for the step socket: each collect yields one step report per rank."""

    name = "steps"

    def __init__(self) -> None:
        self.step = 0
        self.running = True

    def collect(self, now_us_: int) -> Reading:
        if not self.running:
            return Reading()
        out = Reading(discrete=[
            Discrete(StepReport(rank=r, world_size=RANKS, step=self.step,
                                samples_consumed=32 * (self.step + 1), compute_ms=10.0),
                     job_id="job-outage", event_time=now_us_, subject=Subject(rank=r))
            for r in range(RANKS)])
        self.step += 1
        return out


def test_step_reports_survive_a_broker_outage_exactly_once_in_order(
    kafka: KafkaConfig, kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    names = TopicNames(kafka.topic_prefix)
    metrics = AgentMetrics()
    spool = DiskSpool(tmp_path / "spool")
    publisher = SpoolPublisher(spool, kafka, metrics, send_timeout_s=3.0, backoff_s=(0.2, 1.0))
    job = SteppingJob()
    agent = NodeAgent(AgentIdentity("node-outage", "job-outage"), [job], spool, publisher,
                      names, metrics, interval_s=0.1)
    observed = {"max_depth": 0, "broker_down_seen": False}

    async def watch(stop: asyncio.Event) -> None:
        while not stop.is_set():
            observed["max_depth"] = max(int(observed["max_depth"]), len(spool))
            if metrics.registry.get_sample_value("trainguard_agent_broker_up") == 0:
                observed["broker_down_seen"] = True
            await asyncio.sleep(0.05)

    async def scenario() -> int:
        stop = asyncio.Event()
        running = asyncio.create_task(agent.run(stop))
        watcher = asyncio.create_task(watch(stop))
        await asyncio.sleep(1.5)
        await asyncio.to_thread(kafka_broker.stop)
        await asyncio.sleep(3.0)
        await asyncio.to_thread(kafka_broker.start)
        await asyncio.sleep(1.5)
        job.running = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 60
        while len(spool) and loop.time() < deadline:
            await asyncio.sleep(0.2)
        stop.set()
        await asyncio.wait_for(running, 30)
        await watcher
        return job.step

    steps = arun(scenario(), timeout_s=150)
    assert steps > 40
    assert observed["broker_down_seen"], "the outage was not noticed"
    assert int(observed["max_depth"]) > RANKS * 10, "records did not accumulate in the spool"
    assert len(spool) == 0

    async def read() -> list[Delivered]:
        consumer = EventConsumer(kafka, [TopicRole.TASK], group_id=None, name="outage-check",
                                 dlq=None)
        await consumer.start()
        try:
            got = await consumer.drain(idle_ms=1000, limit_s=40)
        finally:
            await consumer.stop()
        return [d for d in got if isinstance(d.event.payload, StepReport)]

    delivered = arun(read())
    reports = [cast(StepReport, d.event.payload) for d in delivered]
    for rank in range(RANKS):
        seen = [r.step for r in reports if r.rank == rank]
        assert seen == list(range(steps)), f"rank {rank}: lost, duplicated or reordered"
    # what the outage held back says so (bus/headers.py): the streams worker holds its
    # watermark for such a backlog; what went out as it came says nothing
    waits = [d.spooled_us for d in delivered]
    assert max(waits) >= 2_000_000, "no record says it waited out the 3 s outage"
    assert waits[:RANKS * 5] == [0] * (RANKS * 5), "records sent before the outage say they waited"


def test_an_uncertain_record_already_written_is_not_sent_again(
    kafka: KafkaConfig, tmp_path: Path
) -> None:
    """The outage's hard case made deterministic: the broker wrote a record, the ack was lost."""
    names = TopicNames(kafka.topic_prefix)
    topic = names.name(TopicRole.TASK)
    spool = DiskSpool(tmp_path / "spool")
    publisher = SpoolPublisher(spool, kafka, AgentMetrics(), send_timeout_s=5.0)
    written = spool.put(topic, b"job-u", b'{"already":"written"}', "step.report", 1)
    fresh = spool.put(topic, b"job-u", b'{"not":"yet"}', "step.report", 2)

    async def scenario() -> list[bytes]:
        async with EventProducer(kafka) as producer:
            await producer.send_raw(topic, written.value, key=written.key)
        publisher._uncertain.add(written.seq)  # as a failed, unacknowledged send leaves it
        assert await publisher._publish(spool.head(10))
        await publisher._close_producer()
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(topic, **kafka.client_kwargs(), group_id=None,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            got = await consumer.getmany(timeout_ms=3000)
        finally:
            await consumer.stop()
        return sorted(r.value for recs in got.values() for r in recs)

    values = arun(scenario())
    assert values == sorted([written.value, fresh.value])  # each exactly once
    assert publisher.reconciled == 1 and len(spool) == 0


def test_a_record_sent_by_a_killed_agent_is_not_sent_again_by_the_next(
    kafka: KafkaConfig, tmp_path: Path
) -> None:
    """The uncertain set lives in the spool's journal: an agent killed after sending (the broker
    wrote the record) and before the ack leaves it uncertain to the agent that restarts."""
    topic = TopicNames(kafka.topic_prefix).name(TopicRole.TASK)
    first = DiskSpool(tmp_path / "spool")
    written = first.put(topic, b"job-k", b'{"sent":"before the kill"}', "step.report", 1)
    fresh = first.put(topic, b"job-k", b'{"put":"after"}', "step.report", 2)
    first.sent([written.seq])  # what the killed agent's publisher journaled before sending
    first.close()  # ... and then it died: no DONE
    spool = DiskSpool(tmp_path / "spool")
    assert spool.uncertain_at_open == {written.seq}
    publisher = SpoolPublisher(spool, kafka, AgentMetrics(), send_timeout_s=5.0)

    async def scenario() -> list[bytes]:
        async with EventProducer(kafka) as producer:  # the send the broker did write
            await producer.send_raw(topic, written.value, key=written.key)
        assert await publisher._publish(spool.head(10))
        await publisher._close_producer()
        from aiokafka import AIOKafkaConsumer

        consumer = AIOKafkaConsumer(topic, **kafka.client_kwargs(), group_id=None,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            got = await consumer.getmany(timeout_ms=3000)
        finally:
            await consumer.stop()
        return sorted(r.value for recs in got.values() for r in recs)

    assert arun(scenario()) == sorted([written.value, fresh.value])  # each exactly once
    assert publisher.reconciled == 1 and len(spool) == 0
