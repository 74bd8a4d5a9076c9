"""Kernel log parsers: every timestamp format, each message family, and never raising."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.collectors.kernel_log import (
    LogLine,
    Malformed,
    Signal,
    TimeContext,
    classify,
    parse_kmsg_record,
    parse_text_line,
)
from trainguard.compat import UTC
from trainguard.events.payloads import NodeHealthKind as K

BOOT = 1_764_000_000_000_000
CTX = TimeContext(boot_time_us=BOOT, tz=UTC, year=2026)
XID79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=48211, name=python, GPU has fallen off the bus."


def _us(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> int:
    return int(datetime(y, mo, d, h, mi, s, tzinfo=UTC).timestamp()) * 1_000_000


def _line(text: str, ctx: TimeContext = CTX, prev: int | None = None) -> LogLine:
    parsed = parse_text_line(text, ctx, prev)
    assert isinstance(parsed, LogLine), parsed
    return parsed


# --- timestamps ------------------------------------------------------------------------


def test_kmsg_record_usec_is_monotonic_from_boot() -> None:
    rec = parse_kmsg_record(f"4,1002,912345678,-;{XID79}\n SUBSYSTEM=pci\n DEVICE=+pci:x\n", CTX)
    assert rec == LogLine(message=XID79, time_us=BOOT + 912_345_678, origin="kmsg", seq=1002,
                          facility=0, level=4)


def test_kmsg_record_with_caller_field_and_user_facility() -> None:
    rec = parse_kmsg_record("11,7,5,-,caller=T12;hello", CTX)
    assert isinstance(rec, LogLine)
    assert (rec.message, rec.facility, rec.level, rec.time_us) == ("hello", 1, 3, BOOT + 5)


@pytest.mark.parametrize("bad", ["no semicolon here", "6,1;msg", "a,b,c,-;msg", "6,-1,5,-;m"])
def test_bad_kmsg_records_are_malformed(bad: str) -> None:
    assert isinstance(parse_kmsg_record(bad, CTX), Malformed)


def test_dmesg_monotonic_seconds() -> None:
    ln = _line(f"[  912.345678] {XID79}")
    assert (ln.time_us, ln.message, ln.origin) == (BOOT + 912_345_678, XID79, "dmesg")


def test_dmesg_delta_raw_and_decoded_prefixes() -> None:
    assert _line("[  912.345678 <    0.000123>] m").time_us == BOOT + 912_345_678
    raw = _line("<4>[  912.345678] m")
    assert (raw.time_us, raw.level, raw.facility) == (BOOT + 912_345_678, 4, 0)
    assert _line("kern  :warn  : [  912.345678] m").message == "m"


def test_dmesg_ctime_is_in_the_context_zone() -> None:
    assert _line("[Tue Dec  1 10:00:00 2026] m").time_us == _us(2026, 12, 1, 10, 0, 0)
    plus2 = TimeContext(boot_time_us=BOOT, tz=timezone(timedelta(hours=2)))
    assert _line("[Tue Dec  1 10:00:00 2026] m", plus2).time_us == _us(2026, 12, 1, 8, 0, 0)


def test_dmesg_iso_with_comma_fraction_and_offset() -> None:
    ln = _line(f"2026-12-01T10:00:00,123456+00:00 {XID79}")
    assert (ln.time_us, ln.origin, ln.message) == (_us(2026, 12, 1, 10) + 123_456, "dmesg", XID79)
    assert _line("2026-12-01T11:00:00,000001+01:00 m").time_us == _us(2026, 12, 1, 10) + 1


def test_dmesg_reltime_and_its_deltas() -> None:
    base = _line("[Dec  1 10:00] m").time_us
    assert base == _us(2026, 12, 1, 10)
    assert _line("[  +0.000250] m", prev=base).time_us == base + 250
    assert _line("[  +1.5] m", prev=None).time_us is None


def test_dmesg_without_time() -> None:
    ln = _line(XID79)
    assert (ln.time_us, ln.message) == (None, XID79)


@pytest.mark.parametrize("text,expected", [
    ("2026-12-01T10:00:00+0000 gpu-node-17 kernel: m", _us(2026, 12, 1, 10)),
    ("2026-12-01T10:00:00+00:00 gpu-node-17 kernel: m", _us(2026, 12, 1, 10)),
    ("2026-12-01T10:00:00.654321+00:00 gpu-node-17 kernel: m", _us(2026, 12, 1, 10) + 654_321),
    ("2026-12-01T12:00:00+0200 gpu-node-17 kernel: m", _us(2026, 12, 1, 10)),
    ("Dec 01 10:00:00.123456 gpu-node-17 kernel: m", _us(2026, 12, 1, 10) + 123_456),
    ("Dec  1 10:00:00 gpu-node-17 kernel: m", _us(2026, 12, 1, 10)),
    ("1796119200.123456 gpu-node-17 kernel: m", 1_796_119_200_123_456),
    ("[  912.345678] gpu-node-17 kernel: m", BOOT + 912_345_678),
])
def test_journal_formats(text: str, expected: int) -> None:
    ln = _line(text)
    assert (ln.time_us, ln.origin, ln.message) == (expected, "journal", "m")


def test_yearless_lines_default_to_this_year_or_last() -> None:
    now = datetime.now(UTC)
    ctx = TimeContext(boot_time_us=BOOT, tz=UTC)
    t = _line(f"{now:%b} {now.day:2d} 00:00:01 h kernel: m", ctx).time_us
    assert t is not None and datetime.fromtimestamp(t / 1e6, UTC).year == now.year
    later = now + timedelta(days=3)
    t2 = _line(f"{later:%b} {later.day:2d} 00:00:01 h kernel: m", ctx).time_us
    assert t2 is not None and t2 < now.timestamp() * 1e6


def test_journal_meta_and_blank_lines_are_skipped() -> None:
    assert parse_text_line("-- No entries --", CTX) is None
    assert parse_text_line("-- Boot 6b1f0c1ad3f84c4f9c1a2b3c4d5e6f70 --", CTX) is None
    assert parse_text_line("   \n", CTX) is None


@pytest.mark.parametrize("bad", [
    "[Tue Foo  1 10:00:00 2026] m",
    "[Tue Feb 31 10:00:00 2026] m",
    "2026-13-01T10:00:00,123456+00:00 m",
    "2026-12-01T10:00:00+99:00 m",
    "Dec 45 10:00:00 h kernel: m",
])
def test_impossible_timestamps_are_malformed(bad: str) -> None:
    out = parse_text_line(bad, CTX)
    assert isinstance(out, Malformed) and out.kind == "timestamp"


# --- messages --------------------------------------------------------------------------


@pytest.mark.parametrize("message,expected", [
    (XID79, Signal(K.XID, code=79, device="0000:3b:00")),
    ("NVRM: Xid (PCI:0000:B7:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable double "
     "bit error (DBE) has been detected", Signal(K.XID, code=48, device="0000:b7:00")),
    ("NVRM: Xid (0000:03:00): 13, 0002 00000000 0000a097 00001b0c 00000000 00000000",
     Signal(K.XID, code=13, device="0000:03:00")),
    ("NVRM: Xid (PCI:3b:00): 31, Ch 00000010, intr 10000000", Signal(K.XID, 31, "0000:3b:00")),
    ("nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 37 egress non-posted PRIV"
     " error", Signal(K.XID, code=12028, device="0000:07:00.0", fault_class="sxid")),
    ("pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
     Signal(K.PCIE_AER, device="0000:01:00.0", fault_class="corrected")),
    ("pcieport 0000:00:01.0: AER: Uncorrected (Fatal) error received: 0000:3b:00.0",
     Signal(K.PCIE_AER, device="0000:3b:00.0", fault_class="uncorrected_fatal")),
    ("pcieport 0000:80:02.0: AER: Uncorrected (Non-Fatal) error received: 0000:81:00.0",
     Signal(K.PCIE_AER, device="0000:81:00.0", fault_class="uncorrected_non_fatal")),
    ("aer 0000:00:03.0:pcie02: Corrected error received: id=0018",
     Signal(K.PCIE_AER, device="0000:00:03.0", fault_class="corrected")),
    ("pcieport 0000:00:1c.0: AER: Multiple Uncorrected (Non-Fatal) error message received from "
     "0000:02:00.0", Signal(K.PCIE_AER, device="0000:02:00.0",
                            fault_class="uncorrected_non_fatal")),
    ("mlx5_core 0000:5e:00.0 ens1f0np0: Link down", Signal(K.LINK_DOWN, device="ens1f0np0")),
    ("mlx5_core 0000:5e:00.0 ens1f0np0: Link up", Signal(K.LINK_UP, device="ens1f0np0")),
    ("e1000e: eth0 NIC Link is Down", Signal(K.LINK_DOWN, device="eth0")),
    ("e1000e 0000:00:19.0 eth0: NIC Link is Up 1000 Mbps Full Duplex, Flow Control: Rx/Tx",
     Signal(K.LINK_UP, device="eth0")),
    ("ixgbe 0000:01:00.0 eth2: NIC Link is Up 10 Gbps, Flow Control: RX/TX",
     Signal(K.LINK_UP, device="eth2")),
    ("bnxt_en 0000:3b:00.0 ens2f0np0: NIC Link is Down", Signal(K.LINK_DOWN, device="ens2f0np0")),
    ("ice 0000:17:00.0 ens785f0: NIC Link is up 100 Gbps Full Duplex, Requested FEC: RS-FEC",
     Signal(K.LINK_UP, device="ens785f0")),
    ("igb 0000:02:00.0 eno1: igb: eno1 NIC Link is Up 1000 Mbps Full Duplex, Flow Control: RX",
     Signal(K.LINK_UP, device="eno1")),
    ("mlx4_en: eth0: Link Up", Signal(K.LINK_UP, device="eth0")),
    ("tg3 0000:04:00.0 eth3: Link is down.", Signal(K.LINK_DOWN, device="eth3")),
    ("bond0: (slave eth1): link status definitely down, disabling slave",
     Signal(K.LINK_DOWN, device="eth1", fault_class="bond")),
    ("bond0: link status definitely up for interface eth1, 10000 Mbps full duplex",
     Signal(K.LINK_UP, device="eth1", fault_class="bond")),
    ("IPv6: ADDRCONF(NETDEV_CHANGE): ib0: link becomes ready", Signal(K.LINK_UP, device="ib0")),
    ("mlx5_ib: mlx5_0: port 1 state changed to ACTIVE",
     Signal(K.LINK_UP, device="mlx5_0/1", fault_class="ib")),
    ("ib0: port 1 state changed from ACTIVE to DOWN",
     Signal(K.LINK_DOWN, device="ib0/1", fault_class="ib")),
    ("Out of memory: Killed process 1234 (python) total-vm:12345678kB, anon-rss:9876543kB, "
     "file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:20480kB oom_score_adj:0",
     Signal(K.OOM_KILL, code=1234)),
    ("Memory cgroup out of memory: Killed process 48211 (python3) total-vm:1kB, anon-rss:1kB",
     Signal(K.OOM_KILL, code=48211, fault_class="memcg")),
    ("Out of memory: Kill process 1240 (python) score 912 or sacrifice child",
     Signal(K.OOM_KILL, code=1240)),
    ("Killed process 1240 (python) total-vm:1234kB, anon-rss:1000kB, file-rss:0kB",
     Signal(K.OOM_KILL, code=1240)),
    ("oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=x,mems_allowed=0-1,"
     "oom_memcg=/kubepods,task_memcg=/kubepods/pod1,task=python3,pid=48211,uid=0",
     Signal(K.OOM_KILL, code=48211, fault_class="memcg")),
    ("oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
     "task_memcg=/user.slice,task=python,pid=777,uid=1000",
     Signal(K.OOM_KILL, code=777, fault_class="global")),
    ("oom_reaper: reaped process 48211 (python3), now anon-rss:0kB, file-rss:0kB",
     Signal(K.OOM_KILL, code=48211)),
    ("Killed process 12166, UID 498, (mysqld) total-vm:16407696kB, anon-rss:16083936kB",
     Signal(K.OOM_KILL, code=12166)),
    ("Out of memory: Killed process 12166, UID 498, (mysqld) total-vm:1kB, anon-rss:1kB",
     Signal(K.OOM_KILL, code=12166)),
    ("Out of memory: Killed process 15925 ((resolved)) total-vm:168424kB, anon-rss:4064kB",
     Signal(K.OOM_KILL, code=15925)),
    ("[22042.602270] Killed process 1350 (udhcpc) total-vm:1204kB, anon-rss:36kB",
     Signal(K.OOM_KILL, code=1350)),
])
def test_classify(message: str, expected: Signal) -> None:
    assert classify(message) == expected


@pytest.mark.parametrize("message", [
    "NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.",
    "nvidia 0000:3b:00.0: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
    "nvme 0000:01:00.0:    [ 0] RxErr",
    "pcieport 0000:00:01.0: AER: enabled with IRQ 122",
    "python3 invoked oom-killer: gfp_mask=0x140cca(GFP_HIGHUSER_MOVABLE|__GFP_COMP), order=0",
    # context lines around a kill: the victim is named by the "Killed process" line
    "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0",
    "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=x,mems_allowed=0,"
    "oom_memcg=/kubepods,task_memcg=/kubepods/pod1",
    "Out of memory and no killable processes...",
    "oom_reaper: unable to reap pid:1234 (python3)",
    "usb 1-1: new high-speed USB device number 2 using xhci_hcd",
    "EXT4-fs (nvme0n1p1): mounted filesystem with ordered data mode.",
    "Linux version 6.8.0-45-generic (buildd@lcy02-amd64-075)",
])
def test_other_messages_are_not_signals(message: str) -> None:
    assert classify(message) is None


@pytest.mark.parametrize("message,kind", [
    ("NVRM: Xid (PCI:0000:3b:00) GPU has fallen off the bus.", "xid"),
    ("NVRM: Xid (PCI:0000:3b:00): pid=1, no code", "xid"),
    ("pcieport 0000:00:01.0: AER: error received", "pcie_aer"),
    ("oom-kill:constraint=CONSTRAINT_NONE,task=python,pid=12x", "oom_kill"),
    ("oom_reaper: reaped process python3 now anon-rss:0kB", "oom_kill"),
])
def test_signal_shaped_but_unreadable_is_malformed(message: str, kind: str) -> None:
    out = classify(message)
    assert isinstance(out, Malformed) and out.kind == kind


# --- properties ------------------------------------------------------------------------

_any_text = st.text(st.characters(codec="utf-8"), max_size=200)
_prefixes = st.sampled_from(["", "[  12.5] ", "<3>", "6,1,2,-;", "NVRM: Xid (PCI:", "[Tue Dec ",
                             "2026-12-01T10:00:00,1+00:00 ", "Dec  1 10:00:00 h kernel: ",
                             "oom-kill:", "AER: Corrected error received: ",
                             "Out of memory: Killed process "])


@settings(max_examples=300, deadline=None)
@given(prefix=_prefixes, text=_any_text)
def test_parsers_never_raise_on_any_text(prefix: str, text: str) -> None:
    line = prefix + text
    for parsed in (parse_kmsg_record(line, CTX), parse_text_line(line, CTX, BOOT)):
        if isinstance(parsed, LogLine):
            classify(parsed.message)
    classify(line)


_hex = "0123456789abcdef"


@settings(max_examples=200, deadline=None)
@given(code=st.integers(0, 10**6), domain=st.text(_hex, min_size=4, max_size=4),
       bus=st.text(_hex, min_size=2, max_size=2), dev=st.text(_hex, min_size=2, max_size=2),
       upper=st.booleans(), pci_prefix=st.booleans(),
       rest=st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80))
def test_a_generated_xid_line_parses_back(code: int, domain: str, bus: str, dev: str,
                                          upper: bool, pci_prefix: bool, rest: str) -> None:
    addr = f"{domain}:{bus}:{dev}"
    shown = addr.upper() if upper else addr
    message = f"NVRM: Xid ({'PCI:' if pci_prefix else ''}{shown}): {code}, {rest}"
    rec = parse_kmsg_record(f"4,99,1000,-;{message}", CTX)
    assert isinstance(rec, LogLine)
    sig = classify(rec.message)
    assert isinstance(sig, Signal)
    assert (sig.kind, sig.code, sig.device) == (K.XID, code, addr)
