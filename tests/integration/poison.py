"""Poison and duplicates on the real broker, one way for every consumer's test
(``test_poison.py``): records that are not events spread between valid ones, on the valid
ones' own topics and partitions; valid records written twice (same bytes, two offsets, as a
producer's retry after a broker failure writes them); the dead letters read back."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from trainguard.bus.config import KafkaConfig
from trainguard.bus.dlq import DeadLetter
from trainguard.bus.producer import stamp_ingest
from trainguard.events.clock import now_us
from trainguard.events.codec import encode, partition_key
from trainguard.events.envelope import Event
from trainguard.events.registry import BY_NAME
from trainguard.events.topics import TopicNames, TopicRole


@dataclass(frozen=True)
class Poison:
    kind: str
    topic: str
    key: bytes
    value: bytes | None
    field: str  # the field its dead letter names


def poison_like(cfg: KafkaConfig, template: Event) -> list[Poison]:
    """One record of each poison kind on ``template``'s topic, keyed by its job (so on its
    job's partition, between that job's valid records)."""
    topic = TopicNames(cfg.topic_prefix).name(BY_NAME[template.type].topic)
    key = template.job_id.encode()
    bad_field = orjson.loads(encode(template))
    bad_field["event_time"] = "yesterday"
    return [
        Poison("null", topic, b"", None, "<record>"),  # a null value (aiokafka needs a key)
        Poison("tombstone", topic, key, None, "<record>"),
        Poison("bad-bytes", topic, key, b"\xff\xfe\x00\x9c not utf-8", "<record>"),
        Poison("not-json", topic, key, b'{"event_id": "cut off', "<record>"),
        Poison("bad-field", topic, key, orjson.dumps(bad_field), "event_time"),
    ]


async def publish(cfg: KafkaConfig, events: Sequence[Event], *, poison_at: Sequence[int] = (),
                  twice: bool = False) -> list[Poison]:
    """Send ``events`` in order, each acknowledged before the next; before each index in
    ``poison_at`` one record of every poison kind shaped like the event there. ``twice``:
    every event is written twice (the same bytes). Returns the poison sent."""
    names = TopicNames(cfg.topic_prefix)
    sent: list[Poison] = []
    producer = AIOKafkaProducer(**cfg.client_kwargs(), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for i, ev in enumerate(events):
            if i in poison_at:
                for p in poison_like(cfg, ev):
                    await producer.send_and_wait(p.topic, value=p.value, key=p.key)
                    sent.append(p)
            raw = encode(stamp_ingest(ev, now_us()))
            for _ in range(2 if twice else 1):
                await producer.send_and_wait(names.name(BY_NAME[ev.type].topic), value=raw,
                                             key=partition_key(ev),
                                             timestamp_ms=ev.event_time // 1000)
    finally:
        await producer.stop()
    return sent


def spread(events: Sequence[Event], times: int = 2) -> list[int]:
    """Indexes ``times`` poison batches go before: first, middle, ..., never the last."""
    n = len(events)
    return sorted({0, *(n * k // (times + 1) for k in range(1, times + 1))})


async def dead_letters(cfg: KafkaConfig, *, want: int, consumer: str | None = None,
                       limit_s: float = 30.0) -> list[DeadLetter]:
    """The dead-letter topic from the start until ``want`` letters (by ``consumer``) are
    there, then whatever else comes within a second."""
    reader = AIOKafkaConsumer(TopicNames(cfg.topic_prefix).name(TopicRole.DLQ),
                              **cfg.client_kwargs(), group_id=None,
                              auto_offset_reset="earliest", isolation_level="read_committed")
    await reader.start()
    got: list[DeadLetter] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    try:
        while loop.time() < deadline:
            batch = await reader.getmany(timeout_ms=500)
            got += [DeadLetter.decode(r.value) for recs in batch.values() for r in recs]
            mine = [d for d in got if consumer is None or d.consumer == consumer]
            if len(mine) >= want:
                batch = await reader.getmany(timeout_ms=1000)
                got += [DeadLetter.decode(r.value) for recs in batch.values() for r in recs]
                break
    finally:
        await reader.stop()
    return [d for d in got if consumer is None or d.consumer == consumer]


def assert_dead_lettered(letters: Sequence[DeadLetter], sent: Sequence[Poison],
                         times: int = 1) -> None:
    """Each poison record sent has exactly ``times`` letters (these letters are one
    consumer's), naming the field, with the original value kept whole."""
    got = Counter((d.source_topic, d.original_value(), d.field) for d in letters)
    want = Counter((p.topic, p.value or b"", p.field) for p in sent for _ in range(times))
    assert got == want, f"letters not sent: {want - got}; letters extra: {got - want}"
    for d in letters:
        assert d.reason and "\n" not in d.reason
        if d.original_value() == b"":
            assert "tombstone" in d.reason or "empty" in d.reason
