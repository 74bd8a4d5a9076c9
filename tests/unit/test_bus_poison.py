"""The shared consume path's parts that need no broker: dead letters, refusals, dedupe."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest
from aiokafka import TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import Delivered, EventConsumer, SeenIds
from trainguard.bus.dlq import DeadLetter, dead_letter, refusal
from trainguard.events.codec import encode
from trainguard.events.errors import ContractError, FieldError
from trainguard.events.samples import sample_events
from trainguard.events.topics import TopicRole

pytestmark = pytest.mark.unit


def test_a_handler_exception_becomes_a_one_line_reason_and_a_contract_error_stays() -> None:
    err = refusal(UnicodeEncodeError("ascii", "é", 0, 1, "ordinal not in range"))
    assert err.first.field == "<handler>"
    assert "handling it raised UnicodeEncodeError" in str(err) and "\n" not in str(err)
    same = ContractError([FieldError("payload.x", 1, "bad")])
    assert refusal(same) is same


def test_a_dead_letter_round_trips_and_anything_else_is_a_value_error() -> None:
    letter = dead_letter(refusal(KeyError("k")), topic="t", partition=0, offset=7, key=None,
                         value=b"", rejected_at=1, consumer="c")
    assert DeadLetter.decode(letter.encode()) == letter
    doc = letter.encode().replace(b'"source_offset":7', b'"source_offset":"7"')
    for raw in (None, b"", b"[]", b"{}", b'{"reason": 1}', doc, b"\xff"):
        with pytest.raises(ValueError):
            DeadLetter.decode(raw)


@given(ids=st.lists(st.sampled_from([f"id{i:06d}" for i in range(40)]), max_size=200),
       capacity=st.integers(1, 50))
@settings(max_examples=200)
def test_seen_ids_is_an_lru_of_first_sightings_bounded_by_its_capacity(
        ids: list[str], capacity: int) -> None:
    seen = SeenIds(capacity)
    model: list[str] = []  # the remembered ids, oldest first
    for eid in ids:
        fresh = eid not in model
        assert seen.add(eid) is fresh
        if fresh:
            model.append(eid)
            del model[:-capacity]
        assert len(seen) == len(model) <= capacity


# --- the consume path over arbitrary records, without a broker -------------------------------

_VALID = [encode(e) for e in sample_events()]


@dataclass
class _Rec:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()  # aiokafka's record has them, maybe none


class _Letters:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def send_raw(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.sent.append(value)


_RECORD = st.one_of(st.none(), st.binary(max_size=64), st.sampled_from(_VALID),
                    st.sampled_from(_VALID).map(lambda raw: raw[: len(raw) // 2]))


@given(values=st.lists(_RECORD, max_size=30), dedupe=st.booleans())
@settings(max_examples=150, deadline=None)
def test_the_consumer_delivers_every_event_and_dead_letters_everything_else(
        values: list[bytes | None], dedupe: bool) -> None:
    letters = _Letters()

    async def go() -> list[Delivered]:
        consumer = EventConsumer(KafkaConfig(bootstrap="127.0.0.1:1", topic_prefix="fz"),
                                 [TopicRole.TASK], group_id=None, name="fuzz",
                                 dlq=letters, dedupe=dedupe)  # type: ignore[arg-type]
        recs = [_Rec("fz.task", 0, i, b"k", v) for i, v in enumerate(values)]
        out = await consumer._accept(TopicPartition("fz.task", 0), recs)
        assert consumer.uncommitted is bool(values)
        assert consumer.stats.delivered == len(out)
        assert consumer.stats.dead_lettered == len(letters.sent)
        return out

    out = asyncio.run(go())
    valid = [v for v in values if v in _VALID]
    want = list(dict.fromkeys(valid)) if dedupe else valid  # sample ids are unique per value
    assert [d.value for d in out] == want
    refused = [v or b"" for v in values if v not in _VALID]
    got = [DeadLetter.decode(raw) for raw in letters.sent]
    assert [letter.original_value() for letter in got] == refused  # in order, kept whole
    assert all(letter.consumer == "fuzz" and letter.field and letter.reason for letter in got)
