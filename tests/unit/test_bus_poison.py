"""The shared consume path's parts that need no broker: dead letters, refusals, dedupe."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.bus.consumer import SeenIds
from trainguard.bus.dlq import DeadLetter, dead_letter, refusal
from trainguard.events.errors import ContractError, FieldError

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
