"""The wire format on fixed examples (the property tests with hypothesis are in the service's
tests/unit/test_sdk_wire*.py; these run on every Python the SDK supports)."""

from __future__ import annotations

import math
import struct

import pytest

from trainguard_sdk import wire


def test_step_layout_sizes_are_the_documented_ones() -> None:
    assert wire.HEADER.size == 6
    assert wire.STEP_FIXED == 108
    assert wire.HEARTBEAT_FIXED == 46 and wire.HEARTBEAT_V1_FIXED == 38
    assert wire.CHECKPOINT_FIXED == 98
    assert wire.STEP_STEP_OFFSET == 92


def test_step_round_trip_keeps_every_field_and_nan() -> None:
    frame = wire.StepFrame("job-1", 1_700_000_000_000_000, 3, 8, 120, 3840, 182.5, pid=42,
                           dp_rank=1, pp_stage=0, tp_rank=2, binding_epoch=7, shard_offset=9,
                           comm_ms=2.5, data_wait_ms=0.25, step_ms=190.0, loss=math.nan)
    data = wire.encode_step(frame)
    assert len(data) == wire.STEP_FIXED + len("job-1")
    assert data[:2] == b"TG" and data[2] == wire.VERSION and data[3] == wire.KIND_STEP
    got = wire.decode(data)
    assert isinstance(got, wire.StepFrame) and got.loss is not None
    assert struct.pack("<d", got.loss) == struct.pack("<d", math.nan)
    assert {**got.__dict__, "loss": 0} == {**frame.__dict__, "loss": 0}


def test_heartbeat_and_checkpoint_round_trip() -> None:
    hb = wire.HeartbeatFrame("job-1", 5, 2, phase="checkpoint", step=9, binding_epoch=1, pid=7)
    assert wire.decode(wire.encode_heartbeat(hb)) == hb
    ck = wire.CheckpointFrame("job-1", 5, 0, "written", 10, 640, "/ckpt/step-000000000010",
                              sha256="ab" * 32, size_bytes=1024, write_ms=3.5, reason="ok")
    assert wire.decode(wire.encode_checkpoint(ck)) == ck


@pytest.mark.parametrize(("data", "kind"), [
    (b"", "bad_length"),
    (b"XX" + bytes(106) + b"j", "bad_magic"),
    (b"TG\x02\x01\x01\x00" + bytes(102) + b"j", "bad_version"),
    (b"TG\x01\x09\x01\x00" + bytes(102) + b"j", "bad_kind"),
    (b"TG\x01\x01\x02\x00" + bytes(102) + b"j", "bad_length"),
])
def test_malformed_datagrams_are_named(data: bytes, kind: str) -> None:
    with pytest.raises(wire.WireError) as err:
        wire.decode(data)
    assert err.value.kind == kind


@pytest.mark.parametrize("job_id", ["", "-x", "a b", "x" * 129, "é"])
def test_bad_job_ids_are_refused(job_id: str) -> None:
    with pytest.raises(ValueError, match="job_id"):
        wire.check_job_id(job_id)
