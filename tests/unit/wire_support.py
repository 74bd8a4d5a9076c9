"""Shared checks for the step socket's datagram kinds (``trainguard_sdk.wire``)."""

from __future__ import annotations

from hypothesis import strategies as st
from trainguard_sdk import wire

JOB = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}", fullmatch=True)
REASONS = st.none() | st.text(min_size=1, max_size=300).filter(
    lambda r: len(r.encode("utf-8", "replace")) <= wire.MAX_REASON_BYTES
    and r.encode("utf-8", "replace").decode() == r)
FRAMES = (wire.StepFrame, wire.HeartbeatFrame, wire.CheckpointFrame, wire.DepartureFrame)


def mangled_decodes_or_wire_error(good: bytes, data: st.DataObject) -> None:
    """Flip up to 4 bytes of a valid datagram and cut it anywhere: decoding gives a frame or
    raises ``WireError`` (a ``bad_*`` kind), nothing else."""
    raw = bytearray(good)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        got = wire.decode(bytes(raw[:cut]))
    except wire.WireError as err:
        assert err.kind.startswith("bad_")
    else:
        assert isinstance(got, FRAMES)
