"""The contract through a real broker: round trips, dead letters, replay from offset 0."""

from __future__ import annotations

import random

from aiokafka import AIOKafkaConsumer

from tests.integration.conftest import arun
from trainguard.bus.admin import ensure_topics, topic_configs
from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import Delivered, EventConsumer
from trainguard.bus.dlq import DeadLetter
from trainguard.bus.producer import EventProducer
from trainguard.events import encode
from trainguard.events.envelope import Event
from trainguard.events.registry import EVENT_TYPES
from trainguard.events.samples import sample_events
from trainguard.events.topics import EVENT_ROLES, SPEC_BY_ROLE, TopicNames, TopicRole

ALL_EVENT_ROLES = list(EVENT_ROLES)


def _strip_ingest(event: Event) -> bytes:
    return encode(event.model_copy(update={"ingest_time": None}))


async def _read_all(cfg: KafkaConfig, producer: EventProducer, name: str) -> list[Delivered]:
    consumer = EventConsumer(cfg, ALL_EVENT_ROLES, group_id=None, name=name, dlq=producer)
    await consumer.start()
    try:
        return await consumer.drain(idle_ms=800, limit_s=40)
    finally:
        await consumer.stop()


async def _read_dlq(cfg: KafkaConfig) -> list[DeadLetter]:
    consumer = AIOKafkaConsumer(TopicNames(cfg.topic_prefix).name(TopicRole.DLQ),
                                **cfg.client_kwargs(), group_id=None,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        got = await consumer.getmany(timeout_ms=5000)
        return [DeadLetter.decode(r.value) for recs in got.values() for r in recs]
    finally:
        await consumer.stop()


def test_every_event_type_survives_the_broker_unchanged(kafka: KafkaConfig) -> None:
    sent = sample_events(job_id="job-rt")

    async def scenario() -> list[Delivered]:
        async with EventProducer(kafka) as producer:
            for ev in sent:
                meta = await producer.send(ev)
                assert meta.offset >= 0
            return await _read_all(kafka, producer, "rt")

    got = arun(scenario())
    assert sorted(d.event.type for d in got) == sorted(t.name for t in EVENT_TYPES)
    by_id = {d.event.event_id: d.event for d in got}
    for ev in sent:
        back = by_id[ev.event_id]
        assert back.ingest_time is not None and back.ingest_time > 0
        assert _strip_ingest(back) == encode(ev)


def test_bad_records_go_to_the_dlq_and_the_good_ones_around_them_all_arrive(
    kafka: KafkaConfig,
) -> None:
    names = TopicNames(kafka.topic_prefix)
    rng = random.Random(7)
    good = [ev for _ in range(5) for ev in sample_events(job_id=f"job-{rng.randrange(99)}")]
    good = [ev.model_copy(update={"event_id": f"ev{i:08d}"}) for i, ev in enumerate(good)]
    bad = [b"not json at all", b'{"type": "step.report"}',
           encode(good[2]).replace(b'"compute_ms":182.5', b'"compute_ms":"slow"')]

    async def scenario() -> tuple[list[Delivered], list[DeadLetter]]:
        async with EventProducer(kafka) as producer:
            for i, ev in enumerate(good):
                await producer.send(ev)
                if i % 17 == 3 and bad:
                    await producer.send_raw(names.name(TopicRole.TASK), bad.pop(), key=b"job-1")
            assert not bad
            delivered = await _read_all(kafka, producer, "dlq-test")
        return delivered, await _read_dlq(kafka)

    delivered, letters = arun(scenario())
    assert sorted(d.event.event_id for d in delivered) == sorted(ev.event_id for ev in good)
    assert len(letters) == 3
    fields = sorted(dl.field for dl in letters)
    assert fields == ["<record>", "event_id", "payload.compute_ms"]
    slow = next(dl for dl in letters if dl.field == "payload.compute_ms")
    assert slow.value == "'slow'" and "valid number" in slow.reason
    assert slow.source_topic == names.name(TopicRole.TASK)
    assert b'"compute_ms":"slow"' in slow.original_value()


def test_reading_again_from_offset_zero_gives_the_identical_sequence(kafka: KafkaConfig) -> None:
    events = [ev.model_copy(update={"event_id": f"seq{i:06d}", "event_time": 1000 + i})
              for i in range(40) for ev in sample_events(job_id=f"job-{i % 4}")[2:4]]

    async def scenario() -> tuple[list[Delivered], list[Delivered]]:
        async with EventProducer(kafka) as producer:
            for ev in events:
                await producer.enqueue(ev)
            await producer.flush()
            first = await _read_all(kafka, producer, "replay-1")
            second = await _read_all(kafka, producer, "replay-2")
        return first, second

    first, second = arun(scenario())
    assert len(first) == len(events)
    key = [(d.topic, d.partition, d.offset, encode(d.event)) for d in first]
    assert key == [(d.topic, d.partition, d.offset, encode(d.event)) for d in second]
    per_job: dict[str, list[str]] = {}
    for d in first:
        per_job.setdefault(d.event.job_id, []).append(d.event.event_id)
    for job, ids in per_job.items():  # one job's events keep their send order
        assert ids == [e.event_id for e in events if e.job_id == job]


def test_topics_on_the_broker_keep_everything(kafka: KafkaConfig) -> None:
    names = TopicNames(kafka.topic_prefix)

    async def scenario() -> dict[str, dict[str, str]]:
        again = await ensure_topics(kafka, names)
        assert not any(s.created for s in again)  # idempotent
        return {n: await topic_configs(kafka, n) for n in names.all().values()}

    for name, cfg in arun(scenario()).items():
        # the log forever; the urgent topic's copies a week (their originals are in the log)
        want = SPEC_BY_ROLE[names.role_of(name)].configs()
        assert want["retention.ms"] == ("604800000" if names.role_of(name) is TopicRole.URGENT
                                        else "-1")
        assert cfg["retention.ms"] == want["retention.ms"], name
        assert cfg["cleanup.policy"] == "delete", name
