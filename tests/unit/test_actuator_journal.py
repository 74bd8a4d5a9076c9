"""The actuator's journal: checksummed records survive, anything else is skipped and counted,
never a crash; the command phases fold into the command in flight."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.actuators.fencing import Identity, identify, open_proven, start_ticks
from trainguard.actuators.journal import (
    Intent,
    Journal,
    ReplicaRecord,
    commands,
    frame,
    in_flight,
    parse,
    phase_record,
    replica_of,
    replicas,
)

pytestmark = pytest.mark.unit

REC = ReplicaRecord("job-a", 1, 3, "u1", 4242, 987654, "boot-x", "cmd-1")


def test_records_round_trip_and_a_torn_tail_is_skipped_then_appended_after(
        tmp_path: Path) -> None:
    path = tmp_path / "replicas.journal"
    j = Journal(path)
    j.append(REC.to_record())
    with open(path, "ab") as fh:  # the actuator died in the middle of a write
        fh.write(frame(REC.to_record())[:17])
    j.append({**REC.to_record(), "pid": 4343})
    again = Journal(path)
    assert [r.pid for r in replicas(again, "job-a")] == [4242, 4343]
    assert again.skipped == 1
    assert replicas(again, "job-b") == []


def test_a_flipped_bit_is_skipped_and_counted(tmp_path: Path) -> None:
    data = bytearray(frame(REC.to_record()) + frame({**REC.to_record(), "pid": 7}))
    data[20] ^= 0x01
    records, skipped = parse(bytes(data))
    assert skipped == 1 and [r["pid"] for r in records] == [7]


def test_fields_of_the_wrong_type_are_not_a_replica() -> None:
    assert replica_of(REC.to_record()) == REC
    for bad in ({"pid": "12"}, {"rank": True}, {"epoch": -1}, {"boot_id": ""},
                {"command_id": 5}, {"kind": "command"}):
        assert replica_of({**REC.to_record(), **bad}) is None, bad


def test_command_phases_fold_and_the_last_without_done_is_in_flight() -> None:
    j = Journal(None)
    first = Intent("c1", "resume", {0: "u0", 1: "u1"}, from_epoch=1)
    j.append(first.to_record())
    for phase in ("fenced", "launched"):
        j.append(phase_record("c1", phase))
    j.append(phase_record("c1", "done", "done"))
    assert in_flight(j) is None
    second = Intent("c2", "migrate", {0: "u0", 1: "spare"}, ("u1",), "migrate (tier 2)",
                    {"command_id": "c2"}, 2)
    j.append(second.to_record())
    j.append(phase_record("c2", "fenced"))
    j.append({"kind": "command", "phase": "exploded", "cid": "c2"})  # unknown: ignored
    got = in_flight(j)
    assert got is not None
    assert (got.cid, got.phase, dict(got.placement), got.quarantine, got.from_epoch,
            got.command) == ("c2", "fenced", {0: "u0", 1: "spare"}, ("u1",), 2,
                             {"command_id": "c2"})
    assert [c.status for c in commands(j)] == ["done", None]


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=600), st.integers(min_value=0, max_value=400),
       st.binary(max_size=8))
def test_fuzz_no_bytes_crash_parse_and_intact_records_survive(
        junk: bytes, cut: int, insert: bytes) -> None:
    good = frame(REC.to_record()) + frame(phase_record("c", "fenced"))
    mixed = good[:cut] + insert + good[cut:] + junk
    records, skipped = parse(mixed)
    assert skipped >= 0
    for rec in records:  # whatever came through is a dict, typed or rejected
        replica_of(rec)
    in_flight_of = Journal(None)
    for rec in records:
        in_flight_of.append(rec)
    commands(in_flight_of)
    # records the damage did not touch are all still there
    records, _ = parse(good + b"\n" + junk + b"\n" + good)
    assert records.count(REC.to_record()) >= 2


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0), st.integers(min_value=0, max_value=255))
def test_fuzz_single_byte_corruption_is_skipped_never_raised(pos: int, byte: int) -> None:
    data = bytearray(frame(REC.to_record()) * 3)
    data[pos % len(data)] = byte
    records, skipped = parse(bytes(data))
    assert len(records) + skipped >= 2
    assert all(r == REC.to_record() for r in records)


def test_this_process_is_proven_and_a_wrong_start_time_or_boot_is_not() -> None:
    me = identify(os.getpid())
    assert me is not None and me.start_ticks == start_ticks(os.getpid())
    fd = open_proven(me)
    assert fd is not None
    os.close(fd)
    assert open_proven(Identity(me.pid, me.start_ticks + 1, me.boot_id)) is None
    assert open_proven(Identity(me.pid, me.start_ticks, "another-boot")) is None
