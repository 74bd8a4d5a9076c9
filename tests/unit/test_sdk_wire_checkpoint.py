"""The checkpoint datagram kind (3): exact round trips, limits, malformed ones only ever
WireError, and the action names kept equal to the contract's."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainguard_sdk import wire

from tests.unit.wire_support import JOB, REASONS, mangled_decodes_or_wire_error
from trainguard.events.payloads import CheckpointAction

U64 = st.integers(0, wire.U64_MAX)
PATHS = st.text(min_size=1, max_size=300).filter(
    lambda p: 1 <= len(p.encode("utf-8", "replace")) <= wire.MAX_PATH_BYTES)

frames = st.builds(
    wire.CheckpointFrame, job_id=JOB, event_time=st.integers(0, 2**53 - 1),
    rank=st.integers(0, wire.U32_MAX), action=st.sampled_from(wire.CHECKPOINT_ACTIONS),
    step=U64, samples_consumed=U64, path=PATHS,
    sha256=st.none() | st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
    size_bytes=st.none() | U64,
    write_ms=st.none() | st.floats(allow_nan=False, allow_infinity=True),
    reason=REASONS, binding_epoch=st.integers(0, wire.U32_MAX),
    pid=st.none() | st.integers(1, wire.U32_MAX))


@settings(max_examples=300, deadline=None)
@given(frames)
def test_round_trip_is_exact(frame: wire.CheckpointFrame) -> None:
    data = wire.encode_checkpoint(frame)
    assert len(data) <= wire.MAX_DATAGRAM
    assert wire.decode(data) == frame


@settings(max_examples=300, deadline=None)
@given(frames, st.data())
def test_mangled_datagrams_raise_only_wire_error(frame: wire.CheckpointFrame,
                                                 data: st.DataObject) -> None:
    mangled_decodes_or_wire_error(wire.encode_checkpoint(frame), data)


def _frame(**kw: object) -> wire.CheckpointFrame:
    base: dict[str, object] = {"job_id": "job-1", "event_time": 5, "rank": 1,
                               "action": "written", "step": 10, "samples_consumed": 640,
                               "path": "/data/ckpt/step-000000000010"}
    return wire.CheckpointFrame(**{**base, **kw})  # type: ignore[arg-type]


def test_layout() -> None:
    assert wire.CHECKPOINT_FIXED == 98
    data = wire.encode_checkpoint(_frame(sha256="ab" * 32, reason="why"))
    assert data[3] == wire.KIND_CHECKPOINT
    path_len, reason_len = struct.unpack_from("<HH", data, 94)
    assert (path_len, reason_len) == (len("/data/ckpt/step-000000000010"), 3)
    assert data[62:94] == bytes.fromhex("ab" * 32)
    assert data.endswith(b"why" + b"job-1")


def test_encoder_refuses_what_does_not_fit_and_cuts_long_reasons() -> None:
    for bad in ({"action": "deleted"}, {"path": ""}, {"path": "x" * (wire.MAX_PATH_BYTES + 1)},
                {"sha256": "AB" * 32}, {"step": -1}, {"rank": 2**32}, {"job_id": "-x"}):
        with pytest.raises(ValueError):
            wire.encode_checkpoint(_frame(**bad))
    got = wire.decode(wire.encode_checkpoint(_frame(reason="é" * 2000)))
    assert isinstance(got, wire.CheckpointFrame) and got.reason == "é" * 512


def test_undecodable_names_travel_replaced_and_bad_text_is_refused() -> None:
    odd = "/data/ckpt-" + b"\xff".decode("utf-8", "surrogateescape")  # as os.fsdecode gives
    got = wire.decode(wire.encode_checkpoint(_frame(path=odd)))
    assert isinstance(got, wire.CheckpointFrame) and got.path == "/data/ckpt-?"
    good = wire.encode_checkpoint(_frame(path="/p"))
    bad = good[:98] + b"\xff" + good[99:]
    with pytest.raises(wire.WireError) as info:
        wire.decode(bad)
    assert info.value.kind == "bad_text"


def test_malformed_checkpoint_kinds() -> None:
    good = wire.encode_checkpoint(_frame())
    cases = {
        "bad_length": [good[:50], good + b"x", good[:-1]],
        "bad_flags": [good[:18] + struct.pack("<H", 1 << 9) + good[20:]],
        "bad_action": [good[:20] + bytes([9]) + good[21:]],
        "bad_job_id": [good[:-5] + b"-job1"],
    }
    for kind, datas in cases.items():
        for data in datas:
            with pytest.raises(wire.WireError) as info:
                wire.decode(data)
            assert info.value.kind == kind, data


def test_actions_are_the_contract_actions() -> None:
    assert set(wire.CHECKPOINT_ACTIONS) == {a.value for a in CheckpointAction}
