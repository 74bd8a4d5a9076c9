"""The kernel log follower over lines captured from real machines (tests/fixtures/kernel/
captured, sources in its README), and over any bytes at all."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.collectors.base import Reading
from trainguard.collectors.kernel_log import (
    KernelLogFollower,
    ListSource,
    Origin,
    TimeContext,
)
from trainguard.compat import UTC
from trainguard.events.payloads import NodeHealth
from trainguard.events.payloads import NodeHealthKind as K

pytestmark = pytest.mark.unit

CAPTURED = Path(__file__).resolve().parents[1] / "fixtures" / "kernel" / "captured"
BOOT = 1_764_000_000_000_000

Row = tuple[K, int | None, str | None, str | None]


def _at(y: int, mo: int, d: int, h: int, mi: int, s: int, us: int = 0) -> int:
    dt = datetime(y, mo, d, h, mi, s, us, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (dt.days * 86_400 + dt.seconds) * 1_000_000 + dt.microseconds


OOM = K.OOM_KILL
EXPECTED: dict[str, tuple[Origin, int, int | None, list[Row]]] = {
    # file: (origin, year for year-less stamps, time of the first signal, signals in order)
    "relate-1383.dmesg-T.log": ("dmesg", 2025, _at(2025, 11, 21, 14, 22, 56),
                                [(OOM, 3581527, None, None)]),
    "py-autovod-7.dmesg-T.log": ("dmesg", 2025, _at(2025, 3, 30, 8, 24, 0),
                                 [(OOM, 7899, None, "global")]),
    "reportportal-kubernetes-203.dmesg.log": ("dmesg", 2026, BOOT + 7063_247407,
                                              [(OOM, 63214, None, "memcg")]),
    "netdata-10875.dmesg.log": ("dmesg", 2026, BOOT + 1836_276684,
                                [(OOM, 4971, None, "memcg")]),
    "docker-for-linux-1001.syslog.log": ("journal", 2021, _at(2021, 5, 15, 23, 9, 30),
                                         [(OOM, 15784, None, None), (OOM, 15925, None, None),
                                          (OOM, 15783, None, None)]),
    "rhel6-mysqld.dmesg.log": ("dmesg", 2026, BOOT + 197352_008908,
                               [(OOM, 12166, None, None)]),
    "netlogo-53.syslog.log": ("journal", 2022, None, []),
    "gpud-46.dmesg-T.log": ("dmesg", 2024, _at(2024, 8, 30, 11, 43, 9),
                            [(K.XID, 13, "0000:cb:00", None), (K.XID, 13, "0000:cb:00", None),
                             (K.XID, 109, "0000:cb:00", None)]),
    "akash-support-244.dmesg-T.log": ("dmesg", 2024, _at(2024, 7, 31, 23, 14, 18),
                                      [(K.XID, 43, "0000:00:05", None),
                                       (K.XID, 43, "0000:00:05", None),
                                       (K.XID, 31, "0000:00:07", None),
                                       (K.XID, 94, "0000:00:08", None)]),
    "nixpkgs-539036.journal.log": ("journal", 2025, _at(2025, 7, 6, 20, 2, 59),
                                   [(K.XID, 13, "0000:01:00", None)]),
    "gpud-1209.journal.log": ("journal", 2026, _at(2026, 2, 14, 5, 3, 41),
                              [(K.LINK_UP, None, "mlx5_5/1", "ib")]),
}


def test_every_captured_file_is_listed() -> None:
    assert {p.name for p in CAPTURED.glob("*.log")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_captured_real_lines(name: str) -> None:
    origin, year, first, rows = EXPECTED[name]
    lines = (CAPTURED / name).read_text(encoding="utf-8").splitlines()
    follower = KernelLogFollower(ListSource(origin, lines), node="n1",
                                 time_context=TimeContext(boot_time_us=BOOT, tz=UTC, year=year))
    reading = follower.collect(now_us=1)
    got = [(p.kind, p.code, p.device, p.fault_class) for d in reading.discrete
           if isinstance(p := d.payload, NodeHealth)]
    assert got == rows
    assert reading.malformed == {}
    if first is not None:
        assert reading.discrete[0].event_time == first


_LINES = st.lists(st.binary(max_size=300), max_size=8)


@settings(max_examples=300, deadline=None)
@given(chunks=_LINES, origin=st.sampled_from(["kmsg", "dmesg", "journal"]))
def test_the_follower_never_raises_on_any_bytes(chunks: list[bytes], origin: Origin) -> None:
    lines = [c.decode("utf-8", errors="replace") for c in chunks]
    follower = KernelLogFollower(ListSource(origin, lines), node="n1",
                                 time_context=TimeContext(boot_time_us=BOOT, tz=UTC, year=2026))
    reading = follower.collect(now_us=1)
    assert isinstance(reading, Reading)
    for d in reading.discrete:
        assert isinstance(d.payload, NodeHealth)


UID_KILL = "Out of memory: Killed process 12166, UID 498, (mysqld) total-vm:16407696kB"
AT = _at(2026, 12, 3, 10, 0, 0)


@pytest.mark.parametrize(("line", "time_us", "origin"), [
    (f"[Thu Dec  3 10:00:00 2026] {UID_KILL}", AT, "dmesg"),  # dmesg -T
    (f"2026-12-03T10:00:00,123456+00:00 {UID_KILL}", AT + 123456, "dmesg"),  # dmesg iso
    (f"2026-12-03T10:00:00,123456+00:00 host kernel: {UID_KILL}", AT + 123456, "journal"),
    (f"Dec 03 10:00:00 host kernel: {UID_KILL}", AT, "journal"),  # journalctl -k
    (f"Dec 03 10:00:00 host kernel: [ 7097.004932] {UID_KILL}", AT, "journal"),  # syslog
    (f"2026-12-03T10:00:00+0000 host kernel: {UID_KILL}", AT, "journal"),  # -o short-iso
    (f"2026-12-03T10:00:00.000001+00:00 host kernel: {UID_KILL}", AT + 1, "journal"),
    (f"[ 7097.004932] {UID_KILL}", BOOT + 7097_004932, "dmesg"),  # plain dmesg
])
def test_each_line_format_with_the_uid_variant(line: str, time_us: int, origin: str) -> None:
    follower = KernelLogFollower(ListSource("dmesg", [line]), node="n1",
                                 time_context=TimeContext(boot_time_us=BOOT, tz=UTC, year=2026))
    (d,) = follower.collect(now_us=1).discrete
    assert isinstance(d.payload, NodeHealth)
    assert (d.payload.kind, d.payload.code, d.payload.origin) == (K.OOM_KILL, 12166, origin)
    assert d.payload.message == UID_KILL  # stamps and host stripped
    assert d.event_time == time_us
