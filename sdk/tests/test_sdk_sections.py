"""Sections: the heartbeat's version-2 layout, old heartbeats still decoding, the reporter's API."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from trainguard_sdk import Section, StepReporter, wire


def test_v2_heartbeat_round_trips_its_section() -> None:
    hb = wire.HeartbeatFrame("job-1", 2_000_000, 3, step=7, section=Section.BACKWARD,
                             section_start=1_500_000, pid=11)
    data = wire.encode_heartbeat(hb)
    assert data[2] == wire.HEARTBEAT_VERSION == 2 and len(data) == wire.HEARTBEAT_FIXED + 5
    assert wire.decode(data) == hb


def test_v1_heartbeat_still_decodes_without_a_section() -> None:
    hb = wire.HeartbeatFrame("job-1", 2_000_000, 3, phase="data", step=7, pid=11)
    data = wire.encode_heartbeat_v1(hb)
    assert data[2] == 1 and len(data) == wire.HEARTBEAT_V1_FIXED + 5
    assert wire.decode(data) == hb
    assert wire.decode(wire.encode_heartbeat(hb)) == hb  # v2 without a section: the same frame


def test_an_unknown_section_index_is_named() -> None:
    data = bytearray(wire.encode_heartbeat(wire.HeartbeatFrame(
        "j", 10, 0, section=Section.DATA, section_start=5)))
    data[21] = len(wire.SECTIONS)
    with pytest.raises(wire.WireError) as err:
        wire.decode(bytes(data))
    assert err.value.kind == "bad_section"


def test_section_without_its_start_is_refused() -> None:
    with pytest.raises(ValueError, match="section"):
        wire.encode_heartbeat(wire.HeartbeatFrame("j", 10, 0, section=Section.DATA))


def test_reporter_heartbeats_carry_the_section_until_the_step_ends_it(
        agent_socket: tuple[Path, socket.socket]) -> None:
    path, rx = agent_socket
    with StepReporter("job-9", 1, 4, socket_path=path, heartbeat_interval_s=None) as tg:
        tg.section(Section.FORWARD)
        tg.section(Section.BACKWARD)
        assert tg.section_now is Section.BACKWARD
        assert tg.heartbeat()
        assert tg.step(5, 160, 12.5)
        assert tg.section_now is None
        assert tg.heartbeat()
        tg.section(Section.CHECKPOINT)
        tg.end_section()
        assert tg.heartbeat()
    frames = [wire.decode(rx.recv(wire.MAX_DATAGRAM)) for _ in range(5)]
    inside, _step, after, ended, idle = frames
    assert isinstance(inside, wire.HeartbeatFrame) and inside.section is Section.BACKWARD
    assert inside.section_start is not None and inside.section_start <= inside.event_time
    assert isinstance(after, wire.HeartbeatFrame) and (after.section, after.step) == (None, 5)
    assert isinstance(ended, wire.HeartbeatFrame) and ended.section is None
    assert isinstance(idle, wire.HeartbeatFrame) and idle.section is None
