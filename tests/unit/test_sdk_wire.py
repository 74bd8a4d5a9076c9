"""The step-socket wire codec: layout, exact round trips, and garbage that never escapes as
anything but WireError."""

from __future__ import annotations

import dataclasses
import math
import struct
import typing
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError
from trainguard_sdk import wire

from trainguard.events.envelope import JobId
from trainguard.events.payloads import Heartbeat

U32 = st.integers(0, wire.U32_MAX)
U64 = st.integers(0, wire.U64_MAX)
TIME = st.integers(0, 2**53 - 1)
ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True)
JOB = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}", fullmatch=True)

step_frames = st.builds(
    wire.StepFrame, job_id=JOB, event_time=TIME, rank=U32,
    world_size=st.integers(1, wire.U32_MAX), step=U64, samples_consumed=U64,
    compute_ms=ANY_FLOAT, pid=st.none() | st.integers(1, wire.U32_MAX),
    dp_rank=st.none() | U32, pp_stage=st.none() | U32, tp_rank=st.none() | U32,
    binding_epoch=U32, shard_offset=st.none() | U64, comm_ms=st.none() | ANY_FLOAT,
    data_wait_ms=st.none() | ANY_FLOAT, step_ms=st.none() | ANY_FLOAT,
    loss=st.none() | ANY_FLOAT)
heartbeat_frames = st.builds(
    wire.HeartbeatFrame, job_id=JOB, event_time=TIME, rank=U32,
    phase=st.sampled_from(wire.PHASES), step=st.none() | U64, binding_epoch=U32,
    pid=st.none() | st.integers(1, wire.U32_MAX))
sectioned = st.tuples(heartbeat_frames, st.none() | st.tuples(st.sampled_from(wire.SECTIONS),
                                                               TIME))


def bits(frame: wire.Frame) -> tuple[Any, ...]:
    """The frame's fields with floats as their IEEE bytes: NaN payloads and -0.0 compare."""
    return tuple(struct.pack("<d", v) if isinstance(v, float) else v
                 for v in (getattr(frame, f.name) for f in dataclasses.fields(frame)))


@settings(max_examples=300, deadline=None)
@given(step_frames)
def test_step_round_trip_is_exact(frame: wire.StepFrame) -> None:
    data = wire.encode_step(frame)
    assert len(data) == wire.STEP_FIXED + len(frame.job_id)
    assert bits(wire.decode(data)) == bits(frame)


@settings(max_examples=200, deadline=None)
@given(heartbeat_frames)
def test_heartbeat_round_trip_is_exact(frame: wire.HeartbeatFrame) -> None:
    data = wire.encode_heartbeat(frame)
    assert len(data) == wire.HEARTBEAT_FIXED + len(frame.job_id)
    assert wire.decode(data) == frame
    old = wire.encode_heartbeat_v1(frame)  # what a version-1 trainer sends: decodes the same
    assert len(old) == wire.HEARTBEAT_V1_FIXED + len(frame.job_id)
    assert wire.decode(old) == frame


@settings(max_examples=200, deadline=None)
@given(sectioned)
def test_sectioned_heartbeat_round_trip_is_exact(
        case: tuple[wire.HeartbeatFrame, tuple[wire.Section, int] | None]) -> None:
    frame, sec = case
    if sec is not None:
        frame = dataclasses.replace(frame, section=sec[0], section_start=sec[1])
    assert wire.decode(wire.encode_heartbeat(frame)) == frame


def test_sections_are_the_heartbeat_sections() -> None:
    from trainguard.events.payloads import Section
    assert [s.name.lower() for s in wire.SECTIONS] == [s.value for s in Section]


def test_nan_and_infinities_survive() -> None:
    base = wire.StepFrame("job-1", 1, 0, 1, 5, 10, 1.0)
    for loss in (math.nan, math.inf, -math.inf):
        got = wire.decode(wire.encode_step(wire.StepFrame(**{**_fields(base), "loss": loss})))
        assert isinstance(got, wire.StepFrame) and got.loss is not None
        assert struct.pack("<d", got.loss) == struct.pack("<d", loss)


def _fields(frame: wire.Frame) -> dict[str, Any]:
    return {f.name: getattr(frame, f.name) for f in dataclasses.fields(frame)}


def _valid_header(kind: int, body: bytes) -> bytes:
    return wire.HEADER.pack(wire.MAGIC, wire.VERSION, kind, max(len(body) - 100, 0), 0) + body


@settings(max_examples=500, deadline=None)
@given(st.one_of(
    st.binary(max_size=600),
    st.builds(_valid_header, st.sampled_from([wire.KIND_STEP, wire.KIND_HEARTBEAT]),
              st.binary(min_size=0, max_size=260)),
    # right length for the kind, random content: reaches the field checks
    st.integers(1, wire.MAX_JOB_LEN).flatmap(lambda n: st.tuples(
        st.just(n), st.sampled_from([wire.STEP_FIXED, wire.HEARTBEAT_FIXED]),
        st.binary(min_size=wire.STEP_FIXED + n, max_size=wire.STEP_FIXED + n))).map(
        lambda t: wire.HEADER.pack(wire.MAGIC, wire.VERSION,
                                   wire.KIND_STEP if t[1] == wire.STEP_FIXED else
                                   wire.KIND_HEARTBEAT, t[0], 0) + t[2][6:t[1] + t[0]]),
))
def test_random_bytes_raise_only_wire_error(data: bytes) -> None:
    try:
        frame = wire.decode(data)
    except wire.WireError as err:
        assert err.kind.startswith("bad_")
    else:
        assert isinstance(frame, wire.StepFrame | wire.HeartbeatFrame)


def test_malformed_kinds() -> None:
    good = wire.encode_step(wire.StepFrame("job-1", 1, 0, 1, 5, 10, 1.0))
    hb = bytearray(wire.encode_heartbeat(wire.HeartbeatFrame("job-1", 1, 0)))
    cases = {
        "bad_length": [b"", b"TG", good + b"x", good[:-1]],
        "bad_magic": [b"XX" + good[2:]],
        "bad_version": [good[:2] + bytes([2]) + good[3:], good[:2] + bytes([3]) + good[3:]],
        "bad_kind": [good[:3] + bytes([7]) + good[4:]],
        "bad_job_id": [good[:-5] + b"\xff-1-x", good[:-5] + b"-job1"],
        "bad_flags": [good[:34] + struct.pack("<H", 1 << 12) + good[36:]],
        "bad_phase": [bytes(hb[:20]) + bytes([9]) + bytes(hb[21:])],
    }
    for kind, datas in cases.items():
        for data in datas:
            with pytest.raises(wire.WireError) as info:
                wire.decode(data)
            assert info.value.kind == kind, data


def test_layout_offsets_match_the_docstring() -> None:
    assert wire.HEADER.size == 6
    assert wire.STEP_VAR_OFFSET == 34
    assert wire.STEP_FIXED == 108
    assert wire.HEARTBEAT_FIXED == 46 and wire.HEARTBEAT_V1_FIXED == 38
    assert wire.STEP_STEP_OFFSET == 92
    assert wire.MAX_DATAGRAM > wire.STEP_FIXED + wire.MAX_JOB_LEN


_JOB_ADAPTER: TypeAdapter[str] = TypeAdapter(JobId)


@settings(max_examples=300, deadline=None)
@given(st.one_of(JOB, st.text(max_size=140),
                 st.from_regex(r"[A-Za-z0-9._:\- ]{0,130}", fullmatch=True)))
def test_job_id_rules_match_the_envelope(job_id: str) -> None:
    try:
        _JOB_ADAPTER.validate_python(job_id)
        envelope_ok = True
    except ValidationError:
        envelope_ok = False
    try:
        wire.check_job_id(job_id)
        wire_ok = True
    except ValueError:
        wire_ok = False
    assert wire_ok == envelope_ok


def test_job_id_examples() -> None:
    for bad in ("", "-x", "a b", "é", "x" * 129, "job1\n"):
        with pytest.raises(ValueError):
            wire.check_job_id(bad)
    assert wire.check_job_id("job-1.a:b_c") == b"job-1.a:b_c"


def test_phases_are_the_heartbeat_phases() -> None:
    literal = typing.get_args(Heartbeat.model_fields["phase"].annotation)
    assert set(wire.PHASES) == set(literal)
    assert set(typing.get_args(wire.Phase)) == set(literal)


def test_encoders_refuse_what_does_not_fit() -> None:
    with pytest.raises(ValueError):
        wire.encode_step(wire.StepFrame("job-1", 1, 2**32, 1, 5, 10, 1.0))
    with pytest.raises(ValueError):
        wire.encode_step(wire.StepFrame("job-1", 1, 0, 1, -5, 10, 1.0))
