"""``NetCollector``: NICs, IB/RoCE ports, TCP retransmits and peer paths of this node's network
namespace, as one ``Reading`` per collect.

Sources: ``<sys_root>/class/net/*`` (state, carrier, speed), ``<proc_root>/net/dev`` (counters
-> rates since the previous collect), ``<sys_root>/class/infiniband/*/ports/*`` (port state and
counters), ``<proc_root>/net/snmp`` (TCP RetransSegs), ``ss`` (TCP_INFO toward the configured
peers, see ``peers``) and optional echo probes (see ``probe``). Link state changes become
``Discrete(NodeHealth)`` events (see ``links``). Nothing raises into the agent: bad or missing
input is counted in ``Reading.malformed``.
"""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainguard.collectors.base import Discrete, Reading
from trainguard.collectors.net.links import LinkState, link_events
from trainguard.collectors.net.parse import (
    DevCounters,
    TcpConn,
    parse_proc_net_dev,
    parse_snmp,
)
from trainguard.collectors.net.peers import (
    ConnKey,
    PeerSpec,
    SsRunner,
    aggregate,
    key,
    parse_for_peers,
    run_ss,
    ss_args,
)
from trainguard.collectors.net.probe import EchoProbe
from trainguard.collectors.net.rates import counter_delta, rate
from trainguard.collectors.net.sysfs import (
    SysReader,
    list_ib_ports,
    list_net,
    read_ib_port,
    read_link,
)
from trainguard.events.envelope import Subject
from trainguard.events.payloads import NicSample, PeerPath

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Prev:
    at: float
    ifindex: int | None
    dev: DevCounters | None


class NetCollector:
    """See the module docstring. Not thread-safe: call ``collect`` from one loop."""

    name = "net"

    def __init__(
        self,
        node: str,
        *,
        job_id: str | None = None,
        sys_root: str | Path = "/sys",
        proc_root: str | Path = "/proc",
        interfaces: Iterable[str] | None = None,
        include_loopback: bool = False,
        include_infiniband: bool = True,
        peers: Sequence[PeerSpec] = (),
        ss_runner: SsRunner | None = run_ss,
        probe_samples: int = 3,
        probe_budget_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``node``: subject of the link events; ``job_id``: their job id (default
        ``node:<node>``). ``sys_root``/``proc_root``: where /sys and /proc are (a fake tree in
        tests). ``interfaces``: only these (default: all but loopback, unless
        ``include_loopback``). ``peers``: the job's peers for ``PeerPath``; ``ss_runner`` runs
        an ``ss`` argv and returns its stdout (``None``: no TCP_INFO). ``probe_samples`` round
        trips within ``probe_budget_s`` per probed peer and collect. ``clock``: seconds, for
        rates."""
        self.node = node
        self.job_id = job_id or f"node:{node}"
        self.sys_root = Path(sys_root)
        self.proc_root = Path(proc_root)
        self.interfaces = None if interfaces is None else set(interfaces)
        self.include_loopback = include_loopback
        self.include_infiniband = include_infiniband
        self.peers = list(peers)
        self.ss_runner = ss_runner
        self.probe_samples = probe_samples
        self.probe_budget_s = probe_budget_s
        self.clock = clock
        self._prev: dict[str, _Prev] = {}
        self._links: dict[str, LinkState] = {}
        self._retrans_segs: int | None = None
        self._conn_retrans: dict[ConnKey, int] = {}
        self._probes: dict[str, EchoProbe] = {
            p.label: EchoProbe(p.host, p.probe_port) for p in self.peers if p.probe_port
        }

    def close(self) -> None:
        for p in self._probes.values():
            p.close()

    # --- the one method -------------------------------------------------------------------

    def collect(self, now_us: int) -> Reading:
        r = SysReader()
        reading = Reading()
        at = self.clock()
        self._nics(reading, r, at, now_us)
        if self.include_infiniband:
            self._ib(reading, r, now_us)
        reading.tcp_retransmits = self._tcp_retransmits(r)
        reading.paths = self._paths(r)
        for kind, n in r.malformed.items():
            reading.malformed[kind] = reading.malformed.get(kind, 0) + n
        return reading

    # --- parts ---------------------------------------------------------------------------

    def _wanted(self, name: str, loopback: bool) -> bool:
        if self.interfaces is not None:
            return name in self.interfaces
        return self.include_loopback or not loopback

    def _nics(self, reading: Reading, r: SysReader, at: float, now_us: int) -> None:
        raw = r.text(self.proc_root / "net" / "dev", "proc_net_dev")
        devs: dict[str, DevCounters] = {}
        if raw is not None:
            parsed = parse_proc_net_dev(raw)
            devs = parsed.value
            r.count("proc_net_dev", parsed.malformed)
        names = sorted(set(list_net(self.sys_root)) | set(devs))
        for name in names:
            link = read_link(self.sys_root, name, r)
            if not self._wanted(name, link.is_loopback):
                continue
            dev = devs.get(name)
            prev = self._prev.get(name)
            if prev is not None and prev.ifindex != link.ifindex:
                prev = None  # re-created: its counters start again
            dt = at - prev.at if prev is not None else 0.0
            old = prev.dev if prev is not None else None

            def rt(field: str, dev: DevCounters | None = dev, old: DevCounters | None = old,
                   dt: float = dt) -> float | None:
                if dev is None or old is None:
                    return None
                return rate(getattr(old, field), getattr(dev, field), dt)

            reading.nics.append(NicSample(
                name=name, kind="ethernet" if not link.is_loopback else "other",
                operstate=link.operstate, carrier=link.carrier,
                carrier_changes=link.carrier_changes, speed_mbps=link.speed_mbps,
                rx_bytes=dev.rx_bytes if dev else None, tx_bytes=dev.tx_bytes if dev else None,
                rx_packets=dev.rx_packets if dev else None,
                tx_packets=dev.tx_packets if dev else None,
                rx_errors=dev.rx_errors if dev else None,
                tx_errors=dev.tx_errors if dev else None,
                rx_dropped=dev.rx_dropped if dev else None,
                tx_dropped=dev.tx_dropped if dev else None,
                rx_bytes_per_s=rt("rx_bytes"), tx_bytes_per_s=rt("tx_bytes"),
                rx_packets_per_s=rt("rx_packets"), tx_packets_per_s=rt("tx_packets"),
            ))
            self._prev[name] = _Prev(at=at, ifindex=link.ifindex, dev=dev)
            state = LinkState(link.operstate, link.carrier, link.carrier_changes)
            self._link_change(reading, name, state, "carrier_changes", now_us)

    def _ib(self, reading: Reading, r: SysReader, now_us: int) -> None:
        for name, path in list_ib_ports(self.sys_root):
            port = read_ib_port(name, path, r)
            reading.nics.append(NicSample(
                name=name, kind="infiniband", operstate=port.operstate,
                carrier=None if port.operstate is None else port.operstate == "up",
                speed_mbps=port.speed_mbps, ib_counters=port.counters,
            ))
            self._link_change(reading, name,
                              LinkState(port.operstate, None, port.counters.get("link_downed")),
                              "link_downed", now_us)

    def _link_change(self, reading: Reading, device: str, state: LinkState, counter: str,
                     now_us: int) -> None:
        for ev in link_events(device, self._links.get(device), state, counter=counter):
            reading.discrete.append(Discrete(payload=ev, job_id=self.job_id, event_time=now_us,
                                             subject=Subject(node=self.node, link=device)))
        self._links[device] = state

    def _tcp_retransmits(self, r: SysReader) -> int | None:
        """Retransmitted TCP segments of this namespace since the previous collect."""
        raw = r.text(self.proc_root / "net" / "snmp", "proc_net_snmp")
        if raw is None:
            return None
        segs = parse_snmp(raw).get("RetransSegs")
        if segs is None:
            r.count("proc_net_snmp")
            return None
        delta = counter_delta(self._retrans_segs, segs)
        self._retrans_segs = segs
        return delta

    def _paths(self, r: SysReader) -> list[PeerPath]:
        if not self.peers:
            return []
        by_peer: dict[str, list[TcpConn]] = {p.label: [] for p in self.peers}
        have_ss = False
        if self.ss_runner is not None:
            try:
                text = self.ss_runner(ss_args(self.peers))
                by_peer, bad = parse_for_peers(text, self.peers)
                r.count("ss", bad)
                have_ss = True
            except (OSError, subprocess.SubprocessError, UnicodeError) as exc:
                log.debug("ss failed: %s", exc)
                r.count("ss")
        seen: dict[ConnKey, int] = {}
        paths: list[PeerPath] = []
        for p in self.peers:
            conns = by_peer.get(p.label, [])
            agg = aggregate(conns, self._conn_retrans)
            for c in conns:
                if c.total_retrans is not None:
                    seen[key(c)] = c.total_retrans
            rtt, var = agg.rtt_ms, agg.rtt_var_ms
            probe = self._probes.get(p.label)
            if probe is not None:
                res = probe.probe(self.probe_samples, self.probe_budget_s)
                r.count("probe_failed", res.failed)
                if res.rtt_ms is not None:
                    rtt, var = res.rtt_ms, res.rtt_var_ms
            paths.append(PeerPath(peer=p.label, rtt_ms=rtt, rtt_var_ms=var,
                                  retransmits=agg.retransmits if have_ss else None,
                                  lost=agg.lost if have_ss else None))
        if have_ss:
            self._conn_retrans = seen
        return paths
