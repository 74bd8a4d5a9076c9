"""Per-peer TCP path health from the kernel's TCP_INFO of the job's own connections.

Why ``ss`` and not ``getsockopt(TCP_INFO)``: getsockopt only answers for sockets this process
owns, and the connections that matter (NCCL/Gloo/the trainer's) belong to other processes.
``ss`` reads every socket's TCP_INFO through the kernel's sock_diag netlink interface, in the
caller's network namespace, so it also works under ``ip netns exec``. One ``ss`` call per collect
covers all peers (the filter is built from them); its text is parsed by a pure function.

Per peer, over its established connections: ``rtt_ms``/``rtt_var_ms`` are the worst
connection's smoothed RTT and its variance (the kernel's srtt/rttvar); ``retransmits`` is the
retransmitted segments during the interval (per connection, ``total_retrans`` now minus at the
previous collect; a connection first seen counts in full); ``lost`` is the kernel's current lost
estimate, summed. A peer with a ``probe_port`` is also probed (see ``probe``): the probe's
application-level round trip then gives ``rtt_ms``/``rtt_var_ms``, because delays added above
the kernel (a proxy, a stalled peer process) are invisible to the kernel's RTT.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from trainguard.collectors.net.parse import TcpConn, parse_ss_tin

SsRunner = Callable[[Sequence[str]], str]
ConnKey = tuple[str, int, str, int]


@dataclass(frozen=True)
class PeerSpec:
    """A peer of the job. ``host``: its IP address (v4 or v6). ``port``: only connections to
    that remote port count (``None``: any). ``probe_port``: an echo responder there is probed
    for the application-level RTT. ``name``: the ``PeerPath.peer`` (default ``host`` or
    ``host:port``)."""

    host: str
    port: int | None = None
    probe_port: int | None = None
    name: str | None = None

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        return self.host if self.port is None else f"{self.host}:{self.port}"

    def matches(self, conn: TcpConn) -> bool:
        return _same_ip(conn.peer, self.host) and (self.port is None or conn.peer_port == self.port)


def _same_ip(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a == b


def ss_args(peers: Iterable[PeerSpec]) -> list[str]:
    """``ss`` argv for the established TCP connections to any of ``peers``."""
    terms: list[str] = []
    for p in peers:
        host = f"[{p.host}]" if ":" in p.host else p.host
        terms.append(f"dst {host}" if p.port is None else f"dst {host}:{p.port}")
    args = ["ss", "-tinH", "state", "established"]
    if terms:
        args += ["(", *" or ".join(terms).split(" "), ")"]
    return args


def run_ss(args: Sequence[str], timeout_s: float = 2.0) -> str:
    """Run ``ss``; its stdout. Raises ``OSError``/``subprocess.SubprocessError`` on failure."""
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout_s,
                          check=True)
    return done.stdout


@dataclass(frozen=True)
class PeerAgg:
    rtt_ms: float | None
    rtt_var_ms: float | None
    retransmits: int | None
    lost: int | None
    connections: int


def aggregate(conns: Sequence[TcpConn], prev_total: dict[ConnKey, int]) -> PeerAgg:
    """One peer's connections -> path numbers. ``prev_total``: per connection, its
    ``total_retrans`` at the previous collect."""
    worst: TcpConn | None = None
    retrans: int | None = None
    lost: int | None = None
    for c in conns:
        if c.rtt_ms is not None and (worst is None or (worst.rtt_ms or 0.0) < c.rtt_ms):
            worst = c
        if c.total_retrans is not None:
            before = prev_total.get(key(c), 0)
            delta = c.total_retrans - before if c.total_retrans >= before else c.total_retrans
            retrans = (retrans or 0) + delta
        if c.lost is not None:
            lost = (lost or 0) + c.lost
    return PeerAgg(rtt_ms=worst.rtt_ms if worst else None,
                   rtt_var_ms=worst.rtt_var_ms if worst else None,
                   retransmits=retrans, lost=lost, connections=len(conns))


def key(c: TcpConn) -> ConnKey:
    return (c.local, c.local_port, c.peer, c.peer_port)


def parse_for_peers(text: str, peers: Sequence[PeerSpec]) -> tuple[dict[str, list[TcpConn]], int]:
    """``ss`` text -> connections by peer label, and the malformed line count."""
    parsed = parse_ss_tin(text)
    by_peer: dict[str, list[TcpConn]] = {p.label: [] for p in peers}
    for c in parsed.value:
        for p in peers:
            if p.matches(c):
                by_peer[p.label].append(c)
                break
    return by_peer, parsed.malformed
