"""Reading /sys/class/net and /sys/class/infiniband: the only I/O of the NIC part.

Every read goes through ``SysReader``, which never raises: a file that is missing or
unreadable is ``None`` and, unless it is expected to be absent, counted by kind in
``malformed``. A down interface answers ``EINVAL`` for ``carrier`` and ``speed``: that is
``None`` and not malformed.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass, field
from pathlib import Path

from trainguard.collectors.net.parse import (
    ib_operstate,
    parse_ib_rate_mbps,
    parse_ib_state,
    parse_int,
)

# Read when present; absent on many devices (no malformed count).
OPTIONAL = frozenset({"speed", "carrier_changes"})


@dataclass
class SysReader:
    malformed: dict[str, int] = field(default_factory=dict)

    def count(self, kind: str, n: int = 1) -> None:
        if n:
            self.malformed[kind] = self.malformed.get(kind, 0) + n

    def text(self, path: Path, kind: str, *, optional: bool = False) -> str | None:
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            if not optional:
                self.count(kind)
        except OSError as exc:
            # EINVAL: carrier/speed of an admin-down link. Not bad input.
            if exc.errno not in (errno.EINVAL, errno.ENODEV) and not optional:
                self.count(kind)
        return None

    def int_(self, path: Path, kind: str, *, optional: bool = False) -> int | None:
        raw = self.text(path, kind, optional=optional)
        if raw is None:
            return None
        value = parse_int(raw)
        if value is None and raw.strip() not in ("", "-1"):
            self.count(kind)
        return value


@dataclass(frozen=True)
class LinkAttrs:
    name: str
    ifindex: int | None
    operstate: str | None
    carrier: bool | None
    carrier_changes: int | None
    speed_mbps: float | None
    is_loopback: bool


def list_net(sys_root: Path) -> list[str]:
    try:
        return sorted(p.name for p in (sys_root / "class" / "net").iterdir())
    except OSError:
        return []


def read_link(sys_root: Path, name: str, r: SysReader) -> LinkAttrs:
    d = sys_root / "class" / "net" / name
    oper = r.text(d / "operstate", "operstate")
    carrier = r.int_(d / "carrier", "carrier")
    speed = r.int_(d / "speed", "speed", optional=True)
    dev_type = r.int_(d / "type", "type", optional=True)
    return LinkAttrs(
        name=name,
        ifindex=r.int_(d / "ifindex", "ifindex", optional=True),
        operstate=(oper.strip() or None) if oper is not None else None,
        carrier=None if carrier is None else carrier != 0,
        carrier_changes=r.int_(d / "carrier_changes", "carrier_changes", optional=True),
        speed_mbps=float(speed) if speed is not None and speed >= 0 else None,
        is_loopback=dev_type == 772 or name == "lo",  # ARPHRD_LOOPBACK
    )


@dataclass(frozen=True)
class IbPort:
    name: str  # "<device>/<port>", e.g. "mlx5_0/1"
    state: str | None
    operstate: str | None
    speed_mbps: float | None
    link_layer: str | None
    counters: dict[str, int]


def list_ib_ports(sys_root: Path) -> list[tuple[str, Path]]:
    base = sys_root / "class" / "infiniband"
    out: list[tuple[str, Path]] = []
    try:
        devs = sorted(base.iterdir())
    except OSError:
        return out
    for dev in devs:
        try:
            ports = sorted((dev / "ports").iterdir(), key=lambda p: p.name)
        except OSError:
            continue
        out.extend((f"{dev.name}/{p.name}", p) for p in ports)
    return out


def read_ib_port(name: str, port: Path, r: SysReader) -> IbPort:
    counters: dict[str, int] = {}
    for sub in ("counters", "hw_counters"):
        try:
            files = sorted(p for p in (port / sub).iterdir() if p.is_file())
        except OSError:
            continue
        for f in files:
            value = r.int_(f, "ib_counter")
            if value is not None and value >= 0:
                counters.setdefault(f.name, value)
    raw_state = r.text(port / "state", "ib_state")
    state = parse_ib_state(raw_state) if raw_state is not None else None
    if raw_state is not None and state is None:
        r.count("ib_state")
    rate_raw = r.text(port / "rate", "ib_rate", optional=True)
    layer = r.text(port / "link_layer", "ib_link_layer", optional=True)
    return IbPort(name=name, state=state, operstate=ib_operstate(state),
                  speed_mbps=parse_ib_rate_mbps(rate_raw) if rate_raw else None,
                  link_layer=layer.strip() if layer else None, counters=counters)
