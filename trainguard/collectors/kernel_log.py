"""Kernel log -> ``NodeHealth``: pure line parsers, and a non-blocking follower.

Parsers (pure, never raise):
- ``parse_kmsg_record``: one ``/dev/kmsg`` record, ``prio,seq,usec,flags[,...];message``
  (continuation lines `` KEY=VALUE`` are dropped); ``usec`` is monotonic, converted with the
  boot time.
- ``parse_text_line``: a line of ``dmesg`` (plain ``[  12.345678]``, ``-d`` deltas, ``-r`` raw
  ``<6>``, ``-x`` ``kern  :err   :``, ``-T`` ctime, ``--time-format iso``, ``reltime``, ``-t``
  no time) or ``journalctl -k`` (``short``, ``short-precise``, ``short-iso``,
  ``short-iso-precise``, ``short-unix``, ``short-monotonic``).
- ``classify``: a kernel message -> NVIDIA Xid / NVSwitch SXid, PCIe AER, NIC / bond / IB link
  up and down, OOM kill; ``None`` for everything else.

A line that is shaped like one of those but cannot be read is a ``Malformed`` (counted by kind
in ``Reading.malformed``, logged once per kind). Everything else is ignored.

The follower (``KernelLogFollower``) drains a ``LineSource`` without blocking: ``KmsgSource``
(``/dev/kmsg``), or ``CommandSource`` running ``journalctl -k -f`` / ``dmesg --follow-new``
where /dev/kmsg cannot be read. ``open_kernel_log`` picks the best one available.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Literal, Protocol

from trainguard.collectors.base import Discrete, Reading
from trainguard.compat import UTC
from trainguard.events.envelope import Subject
from trainguard.events.payloads import NodeHealth, NodeHealthKind

log = logging.getLogger(__name__)

Origin = Literal["kmsg", "journal", "dmesg"]
MAX_TIME_US = 2**53
MAX_MESSAGE = 4096


# --- time ------------------------------------------------------------------------------


def host_boot_time_us() -> int:
    """Epoch µs at monotonic 0: what printk's timestamps count from (suspend time excluded,
    as printk's clock does)."""
    return time.time_ns() // 1000 - time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def local_tz() -> tzinfo:
    tz = datetime.now().astimezone().tzinfo
    return tz if tz is not None else UTC


@dataclass(frozen=True)
class TimeContext:
    """What turns a line's own timestamp into epoch µs.

    ``boot_time_us``: epoch µs at monotonic 0 (kmsg usec, ``[12.345678]``).
    ``tz``: zone of timestamps printed without an offset (``dmesg -T``, journal ``short``).
    ``year``: year of formats printed without one (journal ``short``, dmesg reltime); None ->
    the current year, or the previous one if that would put the line more than a day ahead.
    """

    boot_time_us: int
    tz: tzinfo = UTC
    year: int | None = None

    @classmethod
    def from_host(cls) -> TimeContext:
        return cls(boot_time_us=host_boot_time_us(), tz=local_tz())


_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), 1)}


def _epoch_us(dt: datetime) -> int:
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _frac_us(frac: str | None) -> int:
    if not frac:
        return 0
    return int((frac + "000000")[:6])


def _tz_from_offset(text: str) -> tzinfo:
    if text == "Z":
        return UTC
    sign = -1 if text[0] == "-" else 1
    digits = text[1:].replace(":", "")
    return timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:4])))


def _yearless(ctx: TimeContext, month: int, day: int, hh: int, mm: int, ss: int,
              us: int) -> datetime:
    if ctx.year is not None:
        return datetime(ctx.year, month, day, hh, mm, ss, us, tzinfo=ctx.tz)
    now = datetime.now(ctx.tz)
    dt = datetime(now.year, month, day, hh, mm, ss, us, tzinfo=ctx.tz)
    if dt - now > timedelta(days=1):
        dt = datetime(now.year - 1, month, day, hh, mm, ss, us, tzinfo=ctx.tz)
    return dt


# --- parsed lines ----------------------------------------------------------------------


@dataclass(frozen=True)
class LogLine:
    """One kernel message with its own time (epoch µs; None when the line carried none)."""

    message: str
    time_us: int | None
    origin: Origin
    seq: int | None = None
    facility: int | None = None
    level: int | None = None


@dataclass(frozen=True)
class Malformed:
    kind: str
    reason: str


_MONO = re.compile(r"^\[\s*(\d+)\.(\d+)(?:\s*<\s*[\d.]+>)?\]\s?(.*)$", re.S)
_DELTA = re.compile(r"^\[\s*\+\s*(\d+)\.(\d+)\]\s?(.*)$", re.S)
_CTIME = re.compile(
    r"^\[\s*(?:[A-Z][a-z]{2} )?([A-Z][a-z]{2}) +(\d{1,2}) (\d{1,2}):(\d\d):(\d\d) (\d{4})\]"
    r"\s?(.*)$", re.S)
_RELTIME = re.compile(r"^\[\s*([A-Z][a-z]{2}) +(\d{1,2}) (\d{1,2}):(\d\d)\]\s?(.*)$", re.S)
_ISO = re.compile(
    r"^(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?(Z|[+-]\d\d:?\d\d)\s(.*)$",
    re.S)
_SHORT = re.compile(
    r"^([A-Z][a-z]{2}) +(\d{1,2}) (\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))? (\S+) kernel: ?(.*)$",
    re.S)
_UNIX = re.compile(r"^(\d{9,11})\.(\d{1,9}) (\S+) kernel: ?(.*)$", re.S)
_HOST_KERNEL = re.compile(r"^(\S+) kernel: ?(.*)$", re.S)
_RAW_PRIO = re.compile(r"^<(\d{1,4})>")
_DECODED_PRIO = re.compile(
    r"^(kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local[0-7]) *:"
    r"(emerg|alert|crit|err|warn|notice|info|debug) *: ?")
_JOURNAL_META = re.compile(r"^-- (?:No entries|Boot [0-9a-f]+|Logs begin|Journal begins|"
                           r"Reboot) ?.*--\s*$")


def parse_kmsg_record(record: str, ctx: TimeContext) -> LogLine | Malformed | None:
    """One ``/dev/kmsg`` record -> ``LogLine``; None for an empty record."""
    first = record.split("\n", 1)[0]
    if not first.strip():
        return None
    header, sep, message = first.partition(";")
    if not sep:
        return Malformed("kmsg_record", "no ';' between header and message")
    fields = header.split(",")
    if len(fields) < 3:
        return Malformed("kmsg_record", f"header {header[:40]!r} has fewer than 3 fields")
    try:
        prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return Malformed("kmsg_record", f"header {header[:40]!r} is not prio,seq,usec")
    if prio < 0 or seq < 0 or usec < 0:
        return Malformed("kmsg_record", f"negative field in header {header[:40]!r}")
    t = ctx.boot_time_us + usec
    if not 0 <= t < MAX_TIME_US:
        return Malformed("timestamp", f"kmsg usec {usec} out of range")
    return LogLine(message=message.rstrip("\n"), time_us=t, origin="kmsg", seq=seq,
                   facility=prio >> 3, level=prio & 7)


def parse_text_line(line: str, ctx: TimeContext, prev_time_us: int | None = None,
                    ) -> LogLine | Malformed | None:
    """One line of ``dmesg`` or ``journalctl -k`` text; None for blank / journal meta lines.

    ``prev_time_us`` is the time of the previous line, for dmesg's ``[  +0.000123]`` deltas.
    """
    line = line.rstrip("\r\n")
    if not line.strip() or _JOURNAL_META.match(line):
        return None
    facility: int | None = None
    level: int | None = None
    m = _RAW_PRIO.match(line)
    if m:
        prio = int(m.group(1))
        facility, level = prio >> 3, prio & 7
        line = line[m.end():]
    else:
        m2 = _DECODED_PRIO.match(line)
        if m2:
            line = line[m2.end():]
    try:
        parsed = _parse_text_time(line, ctx, prev_time_us)
    except (ValueError, OverflowError) as exc:
        return Malformed("timestamp", f"{exc}")
    if isinstance(parsed, Malformed):
        return parsed
    t, origin, message = parsed
    if t is not None and not 0 <= t < MAX_TIME_US:
        return Malformed("timestamp", f"time {t} µs out of range")
    return LogLine(message=message, time_us=t, origin=origin, facility=facility, level=level)


_PRINTK_STAMP = re.compile(r"^\[\s*\d+\.\d+\]\s?")


def _strip_host(rest: str) -> tuple[Origin, str]:
    h = _HOST_KERNEL.match(rest)
    if h:
        return "journal", _PRINTK_STAMP.sub("", h.group(2), count=1)
    return "dmesg", rest


def _parse_text_time(line: str, ctx: TimeContext, prev: int | None,
                     ) -> tuple[int | None, Origin, str] | Malformed:
    m = _MONO.match(line)
    if m:  # dmesg plain / -d, or journal short-monotonic (then "host kernel:" follows)
        t = ctx.boot_time_us + int(m.group(1)) * 1_000_000 + _frac_us(m.group(2))
        origin, msg = _strip_host(m.group(3))
        return t, origin, msg
    m = _DELTA.match(line)
    if m:  # dmesg reltime: "+secs" since the previous line
        if prev is None:
            return None, "dmesg", m.group(3)
        return prev + int(m.group(1)) * 1_000_000 + _frac_us(m.group(2)), "dmesg", m.group(3)
    m = _CTIME.match(line)
    if m:  # dmesg -T: local time, no zone
        mon = _MONTHS.get(m.group(1))
        if mon is None:
            return Malformed("timestamp", f"unknown month {m.group(1)!r}")
        dt = datetime(int(m.group(6)), mon, int(m.group(2)), int(m.group(3)), int(m.group(4)),
                      int(m.group(5)), tzinfo=ctx.tz)
        return _epoch_us(dt), "dmesg", m.group(7)
    m = _RELTIME.match(line)
    if m:
        mon = _MONTHS.get(m.group(1))
        if mon is None:
            return Malformed("timestamp", f"unknown month {m.group(1)!r}")
        dt = _yearless(ctx, mon, int(m.group(2)), int(m.group(3)), int(m.group(4)), 0, 0)
        return _epoch_us(dt), "dmesg", m.group(5)
    m = _ISO.match(line)
    if m:  # dmesg --time-format iso, journal short-iso(-precise)
        y, mo, d, hh, mi, ss = (int(g) for g in m.group(1, 2, 3, 4, 5, 6))
        dt = datetime(y, mo, d, hh, mi, ss, _frac_us(m.group(7)), tzinfo=_tz_from_offset(m[8]))
        origin, msg = _strip_host(m.group(9))
        return _epoch_us(dt), origin, msg
    m = _SHORT.match(line)
    if m:  # journal short / short-precise: local time, no year
        mon = _MONTHS.get(m.group(1))
        if mon is None:
            return Malformed("timestamp", f"unknown month {m.group(1)!r}")
        dt = _yearless(ctx, mon, int(m.group(2)), int(m.group(3)), int(m.group(4)),
                       int(m.group(5)), _frac_us(m.group(6)))
        return _epoch_us(dt), "journal", _PRINTK_STAMP.sub("", m.group(8), count=1)
    m = _UNIX.match(line)
    if m:  # journal short-unix
        return int(m.group(1)) * 1_000_000 + _frac_us(m.group(2)), "journal", m.group(4)
    return None, "dmesg", line  # dmesg -t / --time-format notime


# --- classification --------------------------------------------------------------------


@dataclass(frozen=True)
class Signal:
    """What a message says about the node, before it becomes a ``NodeHealth``."""

    kind: NodeHealthKind
    code: int | None = None
    device: str | None = None
    fault_class: str | None = None


_PCI_SHORT = r"(?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
_XID = re.compile(r"\b(NVRM: Xid|SXid) \((?:PCI:)?(" + _PCI_SHORT + r")\): ([0-9]{1,9})\b")
_AER_RECEIVED = re.compile(
    r"(?:^|\s)(?P<port>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])(?::\S+)?: "
    r"(?:AER: )?(?:Multiple )?(?P<sev>Corrected|Uncorrected \((?:Fatal|Non-Fatal)\)|"
    r"Uncorrectable \((?:Fatal|Non-Fatal)\)) error (?:message )?received"
    r"(?::? (?:from |id=)?(?P<src>[0-9a-fA-F:.]+))?")
_NIC_LINK = re.compile(
    r"(?:^|\s)(?P<ifc>[A-Za-z][\w.@-]*):? (?:\w+: [\w.@-]+ )?NIC Link is (?P<st>Up|Down|up|down)\b")
_LINK = re.compile(r"(?:^|\s)(?P<ifc>[A-Za-z][\w.@-]*): Link (?:is )?(?P<st>up|down|Up|Down)\b")
_BOND = re.compile(
    r"(?P<bond>bond[\w.-]*): (?:\(slave (?P<s1>[\w.@-]+)\): )?link status definitely "
    r"(?P<st>up|down)(?: for interface (?P<s2>[\w.@-]+))?")
# mlx5_core (newer drivers): "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE"; INIT and
# ARMED are steps of bringing a port up, not a state to report
_MLX_PORT = re.compile(r"(?P<dev>\b[\w.-]+): Port: (?P<port>\d{1,3}) Link (?P<st>ACTIVE|DOWN)\b")
_LINK_READY = re.compile(r"ADDRCONF\(NETDEV_CHANGE\): (?P<ifc>[\w.@-]+): link becomes ready")
_IB_STATE = (r"\b[Pp]ort (?P<port>\d{1,3})\b[^\n]*?state changed\b(?:[^\n]*?\bto\b)?[:\s]*"
             r"(?P<st>[A-Z_]+)?")
_IB_PORT_DEV = re.compile(
    r"(?P<dev>\b(?:mlx\d_\d+|ib\d+|hfi\d_\d+|qib\d+|bnxt_re\d+|irdma\d+))\b[^\n]*?" + _IB_STATE)
_IB_PORT = re.compile(_IB_STATE)
_OOM_KILLED = re.compile(
    r"(?P<memcg>Memory cgroup )?(?:[Oo]ut of memory(?: \([\w ]+\))?: )?Kill(?:ed)? process "
    r"(?P<pid>[0-9]{1,10})(?:, UID -?[0-9]{1,10},)? \((?P<comm>.*?)\)(?:[ ,]|$)")
_OOM_KILLED_BARE = re.compile(r"(?:^|\]\s?|: )Killed process [0-9]")
_OOM_REAPED = re.compile(
    r"oom_reaper: reaped process (?P<pid>[0-9]{1,10}) \((?P<comm>.*?)\),? now ")
_OOM_KV = re.compile(r"oom-kill:(?P<kv>\S+)")


def _norm_pci(dev: str) -> str:
    dev = dev.lower()
    if dev.count(":") == 1:
        dev = "0000:" + dev
    return dev


def classify(message: str) -> Signal | Malformed | None:
    """What a kernel message says about the node, or None when it is not a health signal."""
    if "Xid" in message:
        m = _XID.search(message)
        if m:
            return Signal(NodeHealthKind.XID, code=int(m.group(3)), device=_norm_pci(m.group(2)),
                          fault_class="sxid" if m.group(1) == "SXid" else None)
        if "NVRM: Xid" in message or re.search(r"\bSXid \(", message):
            return Malformed("xid", "Xid line without '(PCI:dev): code'")
    if "error" in message and "received" in message and ("AER" in message or "aer" in message):
        m2 = _AER_RECEIVED.search(message)
        if m2:
            sev = m2.group("sev").lower().replace("uncorrectable", "uncorrected")
            sev = sev.replace(" (", "_").replace(")", "").replace("-", "_")
            src = m2.group("src")
            device = _norm_pci(src) if src and re.fullmatch(_PCI_SHORT, src) else None
            return Signal(NodeHealthKind.PCIE_AER, device=device or m2.group("port").lower(),
                          fault_class=sev)
        if "AER:" in message:
            return Malformed("pcie_aer", "AER 'error received' line without a severity")
    if "ink" in message:
        sig = _classify_link(message)
        if sig is not None:
            return sig
    if "state changed" in message and "ort " in message:
        m3 = _IB_PORT_DEV.search(message) or _IB_PORT.search(message)
        if m3 and m3.group("st"):
            st = m3.group("st")
            dev = m3.groupdict().get("dev")
            device = f"{dev}/{m3.group('port')}" if dev else f"port{m3.group('port')}"
            if st.startswith("ACTIVE"):
                return Signal(NodeHealthKind.LINK_UP, device=device, fault_class="ib")
            if st in ("DOWN", "INIT", "ARMED", "POLLING", "DISABLED"):
                return Signal(NodeHealthKind.LINK_DOWN, device=device, fault_class="ib")
    return _classify_oom(message)


def _classify_link(message: str) -> Signal | None:
    for pattern in (_NIC_LINK, _LINK):
        m = pattern.search(message)
        if m:
            up = m.group("st").lower() == "up"
            return Signal(NodeHealthKind.LINK_UP if up else NodeHealthKind.LINK_DOWN,
                          device=m.group("ifc"))
    m = _BOND.search(message)
    if m:
        up = m.group("st") == "up"
        return Signal(NodeHealthKind.LINK_UP if up else NodeHealthKind.LINK_DOWN,
                      device=m.group("s1") or m.group("s2") or m.group("bond"),
                      fault_class="bond")
    m = _MLX_PORT.search(message)
    if m:
        return Signal(NodeHealthKind.LINK_UP if m.group("st") == "ACTIVE"
                      else NodeHealthKind.LINK_DOWN,
                      device=f"{m.group('dev')}/{m.group('port')}", fault_class="ib")
    m = _LINK_READY.search(message)
    if m:
        return Signal(NodeHealthKind.LINK_UP, device=m.group("ifc"))
    return None


def _classify_oom(message: str) -> Signal | Malformed | None:
    """The OOM killer's lines about one victim: ``oom-kill:constraint=...,pid=N`` (a context
    line without ``pid=`` is not a signal: the ``Killed process`` line after it names the
    victim), ``[Memory cgroup ]Out of memory: Kill[ed] process N[, UID U,] (name)``, a bare
    ``Killed process N ...`` and ``oom_reaper: reaped process N (name), now ...``. The same pid
    seen twice is reported once by the follower (``dedup_window_us``)."""
    if "oom-kill:" in message:
        m = _OOM_KV.search(message)
        kv: dict[str, str] = {}
        if m:
            for part in m.group("kv").split(","):
                k, sep, v = part.partition("=")
                if sep:
                    kv[k] = v
        if "pid" not in kv:
            return None
        pid = kv["pid"]
        if not re.fullmatch(r"[0-9]{1,10}", pid):
            return Malformed("oom_kill", f"oom-kill line with pid={pid[:20]!r}")
        constraint = kv.get("constraint", "")
        # CONSTRAINT_NONE is a whole-system OOM; MEMCG, CPUSET, MEMORY_POLICY are scoped.
        fc = constraint.removeprefix("CONSTRAINT_").lower() or None
        fc = "global" if fc == "none" else fc
        return Signal(NodeHealthKind.OOM_KILL, code=int(pid), fault_class=fc)
    if "oom_reaper:" in message:
        m3 = _OOM_REAPED.search(message)
        if m3:
            return Signal(NodeHealthKind.OOM_KILL, code=int(m3.group("pid")))
        if "reaped process" in message:
            return Malformed("oom_kill", "oom_reaper line without 'reaped process N (name)'")
        return None
    if "process" in message and ("Kill" in message):
        m2 = _OOM_KILLED.search(message)
        if m2 and ("out of memory" in message.lower() or _OOM_KILLED_BARE.search(message)):
            return Signal(NodeHealthKind.OOM_KILL, code=int(m2.group("pid")),
                          fault_class="memcg" if m2.group("memcg") else None)
    return None


def to_node_health(line: LogLine, signal: Signal) -> NodeHealth:
    return NodeHealth(kind=signal.kind, code=signal.code, device=signal.device,
                      fault_class=signal.fault_class, message=line.message[:MAX_MESSAGE],
                      origin=line.origin)


# --- sources ---------------------------------------------------------------------------


class LineSource(Protocol):
    """Something that gives what it has now without blocking: records or text lines."""

    origin: Origin

    def read_available(self) -> list[str]: ...

    def close(self) -> None: ...


class KmsgSource:
    """``/dev/kmsg``, non-blocking: one ``read`` is one record. Starts at the end of the ring
    unless ``from_start``. Records overwritten before they were read (EPIPE) are counted in
    ``lost``."""

    origin: Origin = "kmsg"

    def __init__(self, path: str = "/dev/kmsg", *, from_start: bool = False,
                 max_records: int = 10_000) -> None:
        self.path = path
        self.max_records = max_records
        self.lost = 0
        self._fd: int | None = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if not from_start:
            os.lseek(self._fd, 0, os.SEEK_END)

    def read_available(self) -> list[str]:
        out: list[str] = []
        while self._fd is not None and len(out) < self.max_records:
            try:
                data = os.read(self._fd, 16384)
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # ring wrapped past us: carry on from the next
                    self.lost += 1
                    continue
                raise
            if not data:
                break
            out.append(data.decode("utf-8", errors="replace"))
        return out

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class CommandSource:
    """A following command's stdout (``journalctl -k -f``, ``dmesg --follow-new``), read
    without blocking; partial lines wait for their end. ``eof`` once the command has ended."""

    def __init__(self, argv: Sequence[str], origin: Origin) -> None:
        self.argv = list(argv)
        self.origin = origin
        self.eof = False
        self._buf = b""
        self._proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        assert self._proc.stdout is not None
        self._fd = self._proc.stdout.fileno()
        os.set_blocking(self._fd, False)

    def read_available(self) -> list[str]:
        while not self.eof:
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                self.eof = True
                break
            self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        if self.eof and self._buf:
            lines.append(self._buf)
            self._buf = b""
        return [ln.decode("utf-8", errors="replace") for ln in lines]

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()


class ListSource:
    """Lines handed in by the caller (tests, replays of a saved log)."""

    def __init__(self, origin: Origin = "dmesg", lines: Iterable[str] = ()) -> None:
        self.origin = origin
        self._pending = list(lines)

    def push(self, *lines: str) -> None:
        self._pending.extend(lines)

    def read_available(self) -> list[str]:
        out, self._pending = self._pending, []
        return out

    def close(self) -> None:
        self._pending = []


JOURNALCTL_ARGV = ("journalctl", "-k", "-f", "-n", "0", "-o", "short-iso-precise", "--no-pager")
DMESG_ARGV = ("dmesg", "--follow-new", "--time-format", "iso")


def open_kernel_log(kmsg_path: str = "/dev/kmsg") -> LineSource:
    """/dev/kmsg if it can be read, else ``journalctl -k -f``, else ``dmesg --follow-new``."""
    try:
        return KmsgSource(kmsg_path)
    except OSError as exc:
        log.info("cannot read %s (%s); trying journalctl / dmesg", kmsg_path, exc)
    if shutil.which("journalctl"):
        return CommandSource(JOURNALCTL_ARGV, "journal")
    if shutil.which("dmesg"):
        return CommandSource(DMESG_ARGV, "dmesg")
    raise OSError(f"no kernel log source: {kmsg_path} unreadable, no journalctl or dmesg")


# --- follower --------------------------------------------------------------------------


class KernelLogFollower:
    """A ``Collector``: each ``collect`` drains the source and returns the health signals as
    ``Discrete(NodeHealth)`` events, timed by their own lines (``now_us`` if a line has none).

    ``node``: subject of every event. ``job_id``: the job id node-level events are filed under
    (default ``node:<node>``). ``pci_to_gpu``: PCI bus id -> GPU index, to set ``subject.gpu``
    on Xids. ``kernel_only``: drop kmsg records not of the kernel facility (user space can
    write /dev/kmsg). An OOM kill printed twice (``oom-kill:`` and ``Killed process``) is
    reported once per pid within ``dedup_window_us``.
    """

    name = "kernel_log"

    def __init__(self, source: LineSource, *, node: str, job_id: str | None = None,
                 time_context: TimeContext | None = None,
                 pci_to_gpu: Mapping[str, int] | None = None, kernel_only: bool = False,
                 dedup_window_us: int = 30_000_000) -> None:
        self.source = source
        self.node = node
        self.job_id = job_id or f"node:{node}"
        self.ctx = time_context or TimeContext.from_host()
        self.pci_to_gpu = {_norm_pci(k): v for k, v in (pci_to_gpu or {}).items()}
        self.kernel_only = kernel_only
        self.dedup_window_us = dedup_window_us
        self._logged: set[str] = set()
        self._prev_time: int | None = None
        self._recent_oom: dict[int, int] = {}
        self._lost_seen = 0

    def collect(self, now_us: int) -> Reading:
        reading = Reading()
        for raw in self.source.read_available():
            self.feed(raw, now_us, reading)
        lost = getattr(self.source, "lost", 0)
        if isinstance(lost, int) and lost > self._lost_seen:
            self._count(reading, Malformed("kmsg_lost", "records overwritten before read"),
                        lost - self._lost_seen, "")
            self._lost_seen = lost
        return reading

    def feed(self, raw: str, now_us: int, reading: Reading) -> None:
        """Parse one record / line into ``reading`` (exposed for replays and tests)."""
        if self.source.origin == "kmsg":
            parsed = parse_kmsg_record(raw, self.ctx)
        else:
            parsed = parse_text_line(raw, self.ctx, self._prev_time)
        if parsed is None:
            return
        if isinstance(parsed, Malformed):
            self._count(reading, parsed, 1, raw)
            return
        if self.kernel_only and parsed.facility not in (None, 0):
            return
        if parsed.time_us is not None:
            self._prev_time = parsed.time_us
        signal = classify(parsed.message)
        if signal is None:
            return
        if isinstance(signal, Malformed):
            self._count(reading, signal, 1, raw)
            return
        event_time = parsed.time_us if parsed.time_us is not None else now_us
        if signal.kind is NodeHealthKind.OOM_KILL and signal.code is not None:
            seen = self._recent_oom.get(signal.code)
            if seen is not None and abs(event_time - seen) <= self.dedup_window_us:
                return
            self._recent_oom = {p: t for p, t in self._recent_oom.items()
                                if abs(event_time - t) <= self.dedup_window_us}
            self._recent_oom[signal.code] = event_time
        gpu = self.pci_to_gpu.get(signal.device or "") if signal.kind is NodeHealthKind.XID \
            else None
        reading.discrete.append(Discrete(payload=to_node_health(parsed, signal),
                                         job_id=self.job_id, event_time=event_time,
                                         subject=Subject(node=self.node, gpu=gpu)))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.source.close()

    def _count(self, reading: Reading, bad: Malformed, n: int, raw: str) -> None:
        reading.malformed[bad.kind] = reading.malformed.get(bad.kind, 0) + n
        if bad.kind not in self._logged:
            self._logged.add(bad.kind)
            log.warning("kernel log: malformed %s (%s): %.200r (further ones only counted)",
                        bad.kind, bad.reason, raw)
