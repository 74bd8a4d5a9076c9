"""The kernel log follower over the fixture files and over its sources."""

from __future__ import annotations

import errno
import logging
import os
import sys
import time
from pathlib import Path

import pytest

from trainguard.collectors.base import Reading
from trainguard.collectors.kernel_log import (
    CommandSource,
    KernelLogFollower,
    KmsgSource,
    ListSource,
    Origin,
    TimeContext,
)
from trainguard.events.payloads import NodeHealth
from trainguard.events.payloads import NodeHealthKind as K

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kernel"
BOOT = 1_764_000_000_000_000
CTX = TimeContext(boot_time_us=BOOT, year=2026)
DEC1_10H = 1_796_119_200_000_000  # 2026-12-01T10:00:00Z

Row = tuple[K, int | None, str | None, str | None]

EXPECTED: dict[str, tuple[Origin, int, list[Row]]] = {
    "kmsg.log": ("kmsg", BOOT + 912_345_678, [
        (K.XID, 79, "0000:3b:00", None), (K.XID, 48, "0000:b7:00", None),
        (K.XID, 13, "0000:18:00", None), (K.PCIE_AER, None, "0000:01:00.0", "corrected"),
        (K.LINK_DOWN, None, "ens1f0np0", None), (K.LINK_UP, None, "ens1f0np0", None),
        (K.OOM_KILL, 48211, None, "memcg"),  # printed twice (oom-kill: + Killed), one event
    ]),
    "dmesg_plain.log": ("dmesg", BOOT + 912_345_678, [
        (K.XID, 79, "0000:3b:00", None),
        (K.PCIE_AER, None, "0000:3b:00.0", "uncorrected_fatal"),
        (K.PCIE_AER, None, "0000:00:03.1", "corrected"),
        (K.PCIE_AER, None, "0000:81:00.0", "uncorrected_non_fatal"),
        (K.LINK_DOWN, None, "eth0", None), (K.LINK_UP, None, "eth0", None),
        (K.LINK_UP, None, "eth2", None), (K.LINK_DOWN, None, "ens2f0np0", None),
        (K.LINK_UP, None, "eno1", None), (K.LINK_DOWN, None, "eth3", None),
        (K.LINK_DOWN, None, "eth1", "bond"), (K.LINK_UP, None, "mlx5_0/1", "ib"),
        (K.LINK_DOWN, None, "ib0/1", "ib"), (K.OOM_KILL, 1234, None, None),
        (K.OOM_KILL, 1240, None, None),  # "Kill process" + "Killed process": one event
    ]),
    "dmesg_ctime.log": ("dmesg", DEC1_10H, [
        (K.XID, 79, "0000:3b:00", None), (K.LINK_DOWN, None, "eth2", None)]),
    "dmesg_iso.log": ("dmesg", DEC1_10H + 123_456, [
        (K.XID, 79, "0000:3b:00", None), (K.PCIE_AER, None, "0000:01:00.0", "corrected")]),
    "journal_short_iso.log": ("journal", DEC1_10H, [
        (K.XID, 79, "0000:3b:00", None), (K.LINK_DOWN, None, "ens1f0np0", None),
        (K.OOM_KILL, 777, None, "global")]),
    "journal_short_precise.log": ("journal", DEC1_10H + 123_456, [
        (K.XID, 79, "0000:3b:00", None), (K.LINK_UP, None, "ens2f0np0", None),
        (K.OOM_KILL, 4321, None, None)]),
}


def _records(name: str) -> list[str]:
    """Fixture lines; for kmsg, continuation lines (leading space) join their record."""
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    if not name.startswith("kmsg"):
        return lines
    records: list[str] = []
    for ln in lines:
        if ln.startswith(" ") and records:
            records[-1] += "\n" + ln
        else:
            records.append(ln)
    return records


def _follower(origin: Origin, lines: list[str], *, job_id: str | None = None,
              pci_to_gpu: dict[str, int] | None = None,
              kernel_only: bool = False) -> KernelLogFollower:
    return KernelLogFollower(ListSource(origin, lines), node="gpu-node-17", time_context=CTX,
                             job_id=job_id, pci_to_gpu=pci_to_gpu, kernel_only=kernel_only)


def _kinds(reading: Reading) -> list[K]:
    return [d.payload.kind for d in reading.discrete if isinstance(d.payload, NodeHealth)]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_files(name: str) -> None:
    origin, first_time, rows = EXPECTED[name]
    reading = _follower(origin, _records(name)).collect(now_us=1)
    payloads = [d.payload for d in reading.discrete]
    assert all(isinstance(p, NodeHealth) for p in payloads)
    got = [(p.kind, p.code, p.device, p.fault_class) for p in payloads
           if isinstance(p, NodeHealth)]
    assert got == rows
    assert reading.malformed == {}
    assert reading.discrete[0].event_time == first_time
    assert {p.origin for p in payloads if isinstance(p, NodeHealth)} == {origin}
    assert {d.subject.node for d in reading.discrete} == {"gpu-node-17"}
    assert {d.job_id for d in reading.discrete} == {"node:gpu-node-17"}


def test_malformed_lines_are_counted_and_logged_once_per_kind(
        caplog: pytest.LogCaptureFixture) -> None:
    lines = _records("malformed.log")
    follower = _follower("dmesg", lines + lines)
    with caplog.at_level(logging.WARNING, logger="trainguard.collectors.kernel_log"):
        reading = follower.collect(now_us=1)
    assert reading.discrete == []
    assert reading.malformed == {"xid": 2, "pcie_aer": 2, "oom_kill": 2, "timestamp": 4}
    assert len(caplog.records) == 4


def test_lines_without_time_take_the_collect_time_and_gpu_mapping() -> None:
    follower = _follower("dmesg", ["NVRM: Xid (PCI:0000:3B:00): 79, GPU has fallen off the bus."],
                         pci_to_gpu={"0000:3b:00": 3}, job_id="job-9")
    (d,) = follower.collect(now_us=42).discrete
    assert (d.event_time, d.subject.gpu, d.job_id) == (42, 3, "job-9")


def test_kernel_only_drops_user_written_kmsg_records() -> None:
    rec = "11,5,100,-;NVRM: Xid (PCI:0000:3b:00): 79, spoofed"
    assert _follower("kmsg", [rec], kernel_only=True).collect(1).discrete == []
    assert len(_follower("kmsg", [rec]).collect(1).discrete) == 1


def test_reltime_deltas_follow_the_previous_line() -> None:
    follower = _follower("dmesg", ["[Dec  1 10:00] usb 1-1: reset",
                                   "[  +0.500000] e1000e: eth0 NIC Link is Down"])
    (d,) = follower.collect(1).discrete
    assert d.event_time == DEC1_10H + 500_000


def test_long_messages_are_cut_to_the_payload_limit() -> None:
    line = "[1.0] NVRM: Xid (PCI:0000:3b:00): 79, " + "x" * 10_000
    (d,) = _follower("dmesg", [line]).collect(1).discrete
    assert isinstance(d.payload, NodeHealth) and len(d.payload.message) == 4096


def test_command_source_reads_without_blocking() -> None:
    script = ("import sys, time\n"
              "print('[  912.345678] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.',"
              " flush=True)\n"
              "sys.stdout.write('[  913.0] e1000e: eth0 NIC Li'); sys.stdout.flush()\n"
              "time.sleep(0.3)\n"
              "print('nk is Down', flush=True)\n")
    src = CommandSource([sys.executable, "-c", script], "dmesg")
    follower = KernelLogFollower(src, node="n1", time_context=CTX)
    try:
        seen: list[K] = []
        deadline = time.monotonic() + 10
        while len(seen) < 2 and not src.eof and time.monotonic() < deadline:
            seen += _kinds(follower.collect(1))  # returns at once, even mid-line
            time.sleep(0.02)
        seen += _kinds(follower.collect(1))
        assert seen == [K.XID, K.LINK_DOWN]
    finally:
        follower.close()


def test_kmsg_source_counts_records_lost_to_ring_overrun(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "kmsg"
    path.write_bytes(b"")
    src = KmsgSource(str(path))
    script: list[bytes | OSError] = [
        OSError(errno.EPIPE, "Broken pipe"),
        b"3,7,100,-;NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n",
        BlockingIOError(errno.EAGAIN, "again"),
    ]

    def fake_read(fd: int, n: int) -> bytes:
        item = script.pop(0)
        if isinstance(item, OSError):
            raise item
        return item

    monkeypatch.setattr(os, "read", fake_read)
    follower = KernelLogFollower(src, node="n1", time_context=CTX)
    reading = follower.collect(1)
    monkeypatch.undo()
    follower.close()
    assert reading.malformed == {"kmsg_lost": 1}
    (d,) = reading.discrete
    assert d.event_time == BOOT + 100


def test_it_is_a_collector() -> None:
    from trainguard.collectors.base import Collector

    c: Collector = _follower("dmesg", [])
    assert c.name == "kernel_log"
