"""The streams worker's two agents over one set of engines (``streams/app.py``'s ``Lanes``),
with stand-ins for faust's topics and table: an urgent copy waiting for its turn cuts into an
ordered batch in progress and is decided first; what each batch decided is saved and sent; a
record on the urgent topic that is not an urgent copy is dead-lettered, and the lane goes on."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import orjson
import pytest

from trainguard.bus.dlq import DeadLetter
from trainguard.bus.headers import spooled_header
from trainguard.events.codec import decode, encode, partition_key
from trainguard.events.envelope import Event
from trainguard.events.payloads import Verdict
from trainguard.events.topics import TopicNames, TopicRole
from trainguard.rules import engine_factory, load_default_rules, synth
from trainguard.streams.app import YIELD_EVERY, Lanes

pytestmark = pytest.mark.unit
JOB = "job-lanes"
PREFIX = "tg"


@dataclass
class Topic:
    sent: list[tuple[bytes | None, bytes | None]] = field(default_factory=list)

    async def send(self, *, key: bytes | None, value: bytes | None) -> None:
        self.sent.append((key, value))


@dataclass
class Sends:
    """``Send`` into one ``Topic`` per name, each send's source message kept beside it."""
    topics: dict[str, Topic] = field(default_factory=dict)
    sources: list[tuple[str, Message]] = field(default_factory=list)

    async def __call__(self, topic: str, key: bytes | None, value: bytes,
                       source: Message) -> None:
        await self.topics.setdefault(topic, Topic()).send(key=key, value=value)
        self.sources.append((topic, source))


@dataclass
class Table:
    data: dict[bytes, bytes] = field(default_factory=dict)
    changelog_topic: Topic = field(default_factory=Topic)


@dataclass
class Message:
    topic: str
    partition: int
    offset: int
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]] = field(default_factory=list)


@dataclass
class Record:  # what faust's take_events yields: the value and its message
    value: bytes
    message: Message


def records(events: list[Event], topic: str) -> list[Record]:
    return [Record(encode(e), Message(topic, 0, i, partition_key(e), encode(e)))
            for i, e in enumerate(events)]


def lanes(*, backlog_hold: bool = False) -> tuple[Lanes, Topic, Topic, Table]:
    sends, names, table = Sends(), TopicNames(PREFIX), Table()
    factory = engine_factory(load_default_rules(), prompt=True, backlog_hold=backlog_hold)
    verdicts = sends.topics[names.name(TopicRole.VERDICTS)] = Topic()
    dlq = sends.topics[names.name(TopicRole.DLQ)] = Topic()
    return Lanes(factory, table, sends, names, None), verdicts, dlq, table


def kinds(topic: Topic) -> list[tuple[str, str]]:
    out = []
    for _, value in topic.sent:
        assert value is not None
        v = decode(value).payload
        assert isinstance(v, Verdict)
        out.append((v.kind.value, v.state.value))
    return out


def test_an_urgent_copy_waiting_cuts_into_an_ordered_batch_and_is_decided_first() -> None:
    log = []
    for e in synth.job_steps(JOB, 8, 40, noise=0.05, seed=2):
        rep = e.payload
        if rep.step == 20 and rep.rank == 0:  # type: ignore[attr-defined]
            e = synth.step_report(JOB, 0, 20, e.event_time, 100.0, loss=float("nan"))
        log.append(e)
    exit_ = synth.process_exit(JOB, "n1", 5, log[-1].event_time + 10, signal=9)
    batch = records([*log, exit_], "tg.task")
    assert len(batch) > 2 * YIELD_EVERY
    lane, verdicts, dlq, table = lanes()

    async def go() -> None:
        await asyncio.gather(lane.ordered_batch(batch),
                             lane.urgent_batch(records([exit_], "tg.urgent")))
    asyncio.run(go())
    got = kinds(verdicts)
    assert got.index(("process_exit", "open")) < got.index(("loss_nonfinite", "open")), got
    assert got.count(("process_exit", "open")) == 1 and dlq.sent == []
    assert lane.waiting == 0 and not lane.turn.locked()
    # the state each turn decided was written to the table and sent to its changelog
    saved = orjson.loads(table.data[JOB.encode()])
    assert saved["prompt"]["early"]  # the copy's verdict, waiting for its original in order
    assert (JOB.encode(), table.data[JOB.encode()]) in table.changelog_topic.sent


def test_without_a_waiting_copy_the_ordered_batch_is_one_turn() -> None:
    lane, verdicts, _, table = lanes()
    log = list(synth.job_steps(JOB, 8, 40))
    exit_ = synth.process_exit(JOB, "n1", 5, log[-1].event_time + 10_000_000, signal=9)
    asyncio.run(lane.ordered_batch(records(log, "tg.task")))
    assert len([k for k, _ in table.changelog_topic.sent if k == JOB.encode()]) == 1
    asyncio.run(lane.urgent_batch(records([exit_], "tg.urgent")))
    assert kinds(verdicts)[-1] == ("process_exit", "open")


def test_a_record_on_the_urgent_topic_that_is_no_urgent_copy_is_dead_lettered() -> None:
    lane, verdicts, dlq, _ = lanes()
    step = synth.step_report(JOB, 0, 1, 1_700_000_000_000_000, 100.0)
    exit_ = synth.process_exit(JOB, "n1", 5, 1_700_000_000_000_001, signal=9)
    bad = records([step, exit_], "tg.urgent")
    bad.insert(1, Record(b"{", Message("tg.urgent", 0, 9, b"k", b"{")))
    asyncio.run(lane.urgent_batch(bad))
    letters = [DeadLetter.decode(v) for _, v in dlq.sent]
    assert [(x.consumer, x.field, x.source_offset) for x in letters] == [
        ("streams.urgent", "type", 0), ("streams.urgent", letters[1].field, 9)]
    assert "not an urgent type" in letters[0].reason
    assert kinds(verdicts) == [("process_exit", "open")]  # the lane went on
    # each send goes in the transaction of the record that caused it
    sends = lane.send
    assert isinstance(sends, Sends)
    names = TopicNames(PREFIX)
    assert [(t, m.offset) for t, m in sends.sources] == [
        (names.name(TopicRole.DLQ), 0), (names.name(TopicRole.DLQ), 9),
        (names.name(TopicRole.VERDICTS), 1)]


def test_a_records_spool_wait_header_reaches_its_engine() -> None:
    """A record that says it waited in an agent's spool (``bus/headers.py``) starts the job's
    backlog hold (``--backlog-hold``): its watermark stands still though later event times
    arrive."""
    lane, _, _, table = lanes(backlog_hold=True)
    log = list(synth.job_steps(JOB, 8, 100))  # 20 s: past the wait for a telemetry lane
    live = records(log[:480], "tg.task")
    backlog = records(log[480:], "tg.task")
    for r in backlog:
        r.message.headers = spooled_header(30_000)
    asyncio.run(lane.ordered_batch(live))
    before = orjson.loads(table.data[JOB.encode()])["buffer"]["watermark"]
    assert before > 0
    asyncio.run(lane.ordered_batch(backlog))
    saved = orjson.loads(table.data[JOB.encode()])["buffer"]
    assert saved["watermark"] == before and saved["hold_until"] > saved["arrival"]
