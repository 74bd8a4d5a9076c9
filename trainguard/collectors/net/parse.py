"""Pure parsers for the network collector: text in, values out, no I/O.

Every parser is total: a line or field it cannot read is left out and counted, never raised.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Generic, TypeVar

T = TypeVar("T")

# /proc/net/dev columns after "<iface>:", in kernel order.
DEV_RX = ("bytes", "packets", "errs", "drop", "fifo", "frame", "compressed", "multicast")
DEV_TX = ("bytes", "packets", "errs", "drop", "fifo", "colls", "carrier", "compressed")


@dataclass(frozen=True)
class DevCounters:
    rx_bytes: int
    rx_packets: int
    rx_errors: int
    rx_dropped: int
    tx_bytes: int
    tx_packets: int
    tx_errors: int
    tx_dropped: int


@dataclass
class Parsed(Generic[T]):
    value: T
    malformed: int = 0


def parse_proc_net_dev(text: str) -> Parsed[dict[str, DevCounters]]:
    """``/proc/net/dev`` -> counters by interface. Header lines have no ':' before the numbers;
    a data line that does not hold 16 integers is counted as malformed."""
    out: dict[str, DevCounters] = {}
    bad = 0
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if not sep or "|" in line:
            continue
        fields = rest.split()
        name = name.strip()
        if not name or len(fields) < 16:
            bad += 1
            continue
        try:
            n = [int(x) for x in fields[:16]]
        except ValueError:
            bad += 1
            continue
        out[name] = DevCounters(rx_bytes=n[0], rx_packets=n[1], rx_errors=n[2], rx_dropped=n[3],
                                tx_bytes=n[8], tx_packets=n[9], tx_errors=n[10],
                                tx_dropped=n[11])
    return Parsed(out, bad)


def parse_snmp(text: str, proto: str = "Tcp") -> dict[str, int]:
    """``/proc/net/snmp`` (or ``netstat``): the ``proto`` header/value line pair -> dict.
    Missing or unreadable pair -> ``{}``."""
    lines = [ln for ln in text.splitlines() if ln.startswith(proto + ":")]
    if len(lines) < 2:
        return {}
    keys = lines[0].split()[1:]
    vals = lines[1].split()[1:]
    out: dict[str, int] = {}
    for k, v in zip(keys, vals, strict=False):
        try:
            out[k] = int(v)
        except ValueError:
            continue
    return out


def parse_int(text: str) -> int | None:
    """A sysfs integer file; ``None`` for anything else (empty, "-1" speed of a down link)."""
    s = text.strip()
    try:
        return int(s, 0) if s.startswith("0x") else int(s)
    except ValueError:
        return None


_IB_STATE = re.compile(r"^\s*(\d+)\s*:\s*(\S+)")
_IB_RATE = re.compile(r"^\s*([\d.]+)\s*Gb/sec")


def parse_ib_state(text: str) -> str | None:
    """``4: ACTIVE`` -> ``"ACTIVE"``."""
    m = _IB_STATE.match(text)
    return m.group(2) if m else None


def ib_operstate(state: str | None) -> str | None:
    """An IB port state as a net operstate: ACTIVE is ``up``, anything else is ``down``."""
    if state is None:
        return None
    return "up" if state.upper() == "ACTIVE" else "down"


def parse_ib_rate_mbps(text: str) -> float | None:
    """``100 Gb/sec (4X EDR)`` -> 100000.0."""
    m = _IB_RATE.match(text)
    if not m:
        return None
    try:
        return float(m.group(1)) * 1000.0
    except ValueError:
        return None


# --- ss -tin ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TcpConn:
    local: str
    local_port: int
    peer: str
    peer_port: int
    rtt_ms: float | None = None
    rtt_var_ms: float | None = None
    retrans_now: int | None = None
    total_retrans: int | None = None
    lost: int | None = None


_STATES = {"ESTAB", "SYN-SENT", "SYN-RECV", "FIN-WAIT-1", "FIN-WAIT-2", "TIME-WAIT", "CLOSE",
           "CLOSE-WAIT", "LAST-ACK", "LISTEN", "CLOSING", "UNCONN"}
_RTT = re.compile(r"(?:^|\s)rtt:([\d.]+)/([\d.]+)")
_RETRANS = re.compile(r"(?:^|\s)retrans:(\d+)/(\d+)")
_LOST = re.compile(r"(?:^|\s)lost:(\d+)")


def split_addr(token: str) -> tuple[str, int] | None:
    """``10.0.0.2:5555`` / ``[::1]:22`` / ``[::ffff:10.0.0.2]:80`` -> (host, port); the
    v4-mapped form gives the v4 address, a ``%scope`` is dropped."""
    host, sep, port = token.rpartition(":")
    if not sep or not port.isdigit():
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    host = host.split("%", 1)[0]
    if host.lower().startswith("::ffff:") and "." in host:
        host = host[7:]
    if not host:
        return None
    return host, int(port)


def parse_ss_tin(text: str) -> Parsed[list[TcpConn]]:
    """``ss -tinH [state established] ...`` output -> connections with their TCP_INFO.

    A connection line names the sockets (with or without the State column); the indented line
    after it holds the TCP_INFO fields (``rtt:srtt/rttvar``, ``retrans:now/total``, ``lost:n``).
    Header lines are skipped; a connection line without two addresses is malformed."""
    conns: list[TcpConn] = []
    bad = 0
    cur: TcpConn | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if line[0].isspace():
            if cur is None:
                bad += 1
                continue
            cur = _with_info(cur, line)
            conns[-1] = cur
            continue
        cur = None
        tokens = line.split()
        if tokens and tokens[0] in ("State", "Recv-Q", "Netid"):
            continue
        if tokens and tokens[0] in _STATES:
            tokens = tokens[1:]
        if tokens and tokens[0] == "tcp":
            tokens = tokens[1:]
        if len(tokens) < 4:
            bad += 1
            continue
        local, peer = split_addr(tokens[2]), split_addr(tokens[3])
        if local is None or peer is None:
            bad += 1
            continue
        cur = TcpConn(local=local[0], local_port=local[1], peer=peer[0], peer_port=peer[1])
        conns.append(cur)
    return Parsed(conns, bad)


def _with_info(conn: TcpConn, line: str) -> TcpConn:
    # ss prints retrans:/lost: only when non-zero: an info line without them means 0.
    conn = replace(conn, retrans_now=conn.retrans_now or 0,
                   total_retrans=conn.total_retrans or 0, lost=conn.lost or 0)
    m = _RTT.search(line)
    if m:
        conn = replace(conn, rtt_ms=float(m.group(1)), rtt_var_ms=float(m.group(2)))
    m = _RETRANS.search(line)
    if m:
        conn = replace(conn, retrans_now=int(m.group(1)), total_retrans=int(m.group(2)))
    m = _LOST.search(line)
    if m:
        conn = replace(conn, lost=int(m.group(1)))
    return conn
