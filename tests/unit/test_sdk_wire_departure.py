"""The departure datagram kind (4): exact round trips, limits, malformed ones only ever
WireError, and the cause names kept equal to the contract's."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainguard_sdk import wire

from tests.unit.wire_support import JOB, REASONS, mangled_decodes_or_wire_error
from trainguard.events.payloads import DepartureCause

frames = st.builds(
    wire.DepartureFrame, job_id=JOB, event_time=st.integers(0, 2**53 - 1),
    rank=st.integers(0, wire.U32_MAX), cause=st.sampled_from(wire.DEPARTURE_CAUSES),
    exit_code=st.integers(0, 255), reason=REASONS, binding_epoch=st.integers(0, wire.U32_MAX),
    pid=st.none() | st.integers(1, wire.U32_MAX))


@settings(max_examples=300, deadline=None)
@given(frames)
def test_round_trip_is_exact(frame: wire.DepartureFrame) -> None:
    data = wire.encode_departure(frame)
    assert len(data) <= wire.MAX_DATAGRAM
    assert wire.decode(data) == frame


@settings(max_examples=300, deadline=None)
@given(frames, st.data())
def test_mangled_datagrams_raise_only_wire_error(frame: wire.DepartureFrame,
                                                 data: st.DataObject) -> None:
    mangled_decodes_or_wire_error(wire.encode_departure(frame), data)


def _frame(**kw: object) -> wire.DepartureFrame:
    base: dict[str, object] = {"job_id": "job-1", "event_time": 5, "rank": 1,
                               "cause": "peer_lost", "exit_code": 3}
    return wire.DepartureFrame(**{**base, **kw})  # type: ignore[arg-type]


def test_layout_matches_the_docstring() -> None:
    assert wire.DEPARTURE_FIXED == 30
    data = wire.encode_departure(_frame(reason="why", pid=77, binding_epoch=2,
                                        event_time=1_000))
    assert data[3] == wire.KIND_DEPARTURE and data[4] == len("job-1")
    assert struct.unpack_from("<IIIBBQH", data, 6) == (77, 1, 2, 1, 3, 1_000_000, 3)
    assert data.endswith(b"why" + b"job-1") and len(data) == 30 + 3 + 5


def test_encoder_refuses_what_does_not_fit_and_cuts_long_reasons() -> None:
    for bad in ({"cause": "bored"}, {"exit_code": 256}, {"exit_code": -1},
                {"exit_code": True}, {"rank": 2**32}, {"job_id": "-x"}):
        with pytest.raises(ValueError):
            wire.encode_departure(_frame(**bad))
    got = wire.decode(wire.encode_departure(_frame(reason="é" * 2000)))
    assert isinstance(got, wire.DepartureFrame) and got.reason == "é" * 512


def test_malformed_departure_kinds() -> None:
    good = wire.encode_departure(_frame(reason="r"))
    cases = {
        "bad_length": [good[:20], good + b"x", good[:-1],
                       good[:28] + struct.pack("<H", 2000) + good[30:]],
        "bad_cause": [good[:18] + bytes([9]) + good[19:]],
        "bad_text": [good[:30] + b"\xff" + good[31:]],
        "bad_job_id": [good[:-5] + b"-job1"],
    }
    for kind, datas in cases.items():
        for data in datas:
            with pytest.raises(wire.WireError) as info:
                wire.decode(data)
            assert info.value.kind == kind, data


def test_causes_are_the_contract_causes_in_order() -> None:
    assert list(wire.DEPARTURE_CAUSES) == [c.value for c in DepartureCause]
