"""The net collector against real kernel parts: two network namespaces joined by veth, link
flaps, nftables random drops, tc tbf throttling, and Toxiproxy latency on 127.0.0.1.

Needs root (namespaces), iproute2, nftables and, for the latency test, Go (to build
toxiproxy-server once into ~/.cache/trainguard). Addresses are 10.x inside the namespaces the
lab creates; nothing else is ever contacted.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from trainguard.collectors.net import EchoResponder, NetCollector, PeerSpec
from trainguard.events.clock import now_us
from trainguard.netlab import (
    LineProcess,
    Netns,
    NftDrop,
    Tbf,
    ToxiproxyServer,
    VethLab,
    ensure_toxiproxy_server,
    flap_link,
    set_link,
)
from trainguard.netlab.faults import wait_operstate
from trainguard.netlab.ns import leftovers, run, sweep_stale

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(60),
    # Under CI=true these run (and fail without root); a developer without root may skip.
    pytest.mark.skipif(os.environ.get("CI") != "true" and os.geteuid() != 0,
                       reason="network namespaces need root"),
]

Json = dict[str, Any]
PORT = 5201
# The loss tests pace their stream: unpaced it saturates a loaded 2-core host (~110k segments/s),
# and the starved stack then resends spuriously (CI saw 1.6 % retransmits with no drop rule).
PACED_BYTES_PER_S = 10_000_000


@pytest.fixture
def lab() -> Iterator[VethLab]:
    # One wire segment per skb, so an nftables "packet" is one TCP segment.
    with VethLab(gso_max_segs=1) as lab:
        yield lab
    assert not [n for n in leftovers() if lab.tag in n], "a namespace was left behind"


class NsCollector:
    """The net collector as a process inside a namespace; one reading per ``collect``."""

    def __init__(self, ns: Netns, iface: str, *peers: str) -> None:
        args = ["--stdin", "--node", ns.name, "--iface", iface]
        for p in peers:
            args += ["--peer", p]
        self.proc: LineProcess = ns.spawn_python("trainguard.collectors.net", *args, stdin=True)

    def collect(self) -> Json:
        self.proc.send("")
        out: Json = json.loads(self.proc.readline(timeout_s=15))
        return out


def nic(reading: Json, name: str) -> Json:
    found: list[Json] = [n for n in reading["nics"] if n["name"] == name]
    assert len(found) == 1, f"{name} not in {[n['name'] for n in reading['nics']]}"
    return found[0]


def events(reading: Json, device: str) -> list[tuple[str, int | None]]:
    return [(e["kind"], e["code"]) for e in reading["discrete"] if e["device"] == device]


def start_sink(lab: VethLab) -> LineProcess:
    sink = lab.b.spawn_python("trainguard.netlab.traffic", "sink", "--bind", lab.addr_b,
                              "--port", str(PORT), "--max-seconds", "30")
    assert sink.readline(timeout_s=10) == "ready"
    return sink


def start_sender(lab: VethLab, seconds: float, rate_bytes: int | None = None) -> LineProcess:
    pace = ["--rate-bytes", str(rate_bytes)] if rate_bytes is not None else []
    send = lab.a.spawn_python("trainguard.netlab.traffic", "send", "--to",
                              f"{lab.addr_b}:{PORT}", "--seconds", str(seconds), *pace)
    assert send.readline(timeout_s=10) == "connected"
    return send


def sender_result(send: LineProcess, seconds: float) -> Json:
    out: Json = json.loads(send.readline(timeout_s=seconds + 10))
    return out


# --- (a) link down and flaps -----------------------------------------------------------------


def test_link_down_and_flaps_show_in_sysfs_and_as_events(lab: VethLab) -> None:
    flaps = 3
    ca = NsCollector(lab.a, lab.dev_a)
    cb = NsCollector(lab.b, lab.dev_b)
    r0a, _ = ca.collect(), cb.collect()
    assert nic(r0a, lab.dev_a)["operstate"] == "up"
    assert nic(r0a, lab.dev_a)["carrier"] is True

    set_link(lab.a, lab.dev_a, False)
    wait_operstate(lab.a, lab.dev_a, "down")
    r1a, r1b = ca.collect(), cb.collect()
    assert nic(r1a, lab.dev_a)["operstate"] == "down"
    assert nic(r1a, lab.dev_a)["carrier"] is None  # EINVAL on an admin-down link: not malformed
    assert r1a["malformed"] == {}
    assert ("link_down", 1) in events(r1a, lab.dev_a)
    assert nic(r1b, lab.dev_b)["carrier"] is False  # the far end lost its carrier
    assert [k for k, _ in events(r1b, lab.dev_b)] == ["link_down"]

    set_link(lab.a, lab.dev_a, True)
    wait_operstate(lab.a, lab.dev_a, "up")
    r2a, r2b = ca.collect(), cb.collect()
    assert [k for k, _ in events(r2a, lab.dev_a)] == ["link_up"]

    flap_link(lab.a, lab.dev_a, flaps)
    wait_operstate(lab.a, lab.dev_a, "up")
    wait_operstate(lab.b, lab.dev_b, "up")
    r3a, r3b = ca.collect(), cb.collect()
    for r_before, r_after, dev in ((r2a, r3a, lab.dev_a), (r2b, r3b, lab.dev_b)):
        before = nic(r_before, dev)["carrier_changes"]
        after = nic(r_after, dev)["carrier_changes"]
        assert after - before >= 2 * flaps, (dev, before, after)
        assert nic(r_after, dev)["operstate"] == "up"
        # Both flapped and back up between two collects: a LINK_DOWN and a LINK_UP with the count.
        evs = events(r_after, dev)
        assert [k for k, _ in evs] == ["link_down", "link_up"], evs
        assert all(code is not None and code >= 2 * flaps for _, code in evs), evs
    print(f"\nflaps={flaps}: carrier_changes {lab.dev_a} "
          f"{nic(r2a, lab.dev_a)['carrier_changes']}->{nic(r3a, lab.dev_a)['carrier_changes']}, "
          f"{lab.dev_b} {nic(r2b, lab.dev_b)['carrier_changes']}->"
          f"{nic(r3b, lab.dev_b)['carrier_changes']}; events a={events(r3a, lab.dev_a)}")


# --- (b) random loss -------------------------------------------------------------------------


def test_nft_random_drops_show_as_retransmits(lab: VethLab) -> None:
    percent, seconds = 5, 2.5
    start_sink(lab)
    coll = NsCollector(lab.a, lab.dev_a, f"{lab.addr_b}:{PORT}")
    r0 = coll.collect()
    # Dropped on arrival at b (wire loss), data segments a -> b only.
    with NftDrop(lab.b, percent, saddr=lab.addr_a, dport=PORT, hook="input") as drop:
        send = start_sender(lab, seconds, PACED_BYTES_PER_S)
        time.sleep(seconds * 0.6)
        r1 = coll.collect()  # while the stream runs: its connection is in ss
        result = sender_result(send, seconds)
        r2 = coll.collect()
        seen, dropped = drop.counters()
    retrans = (r1["tcp_retransmits"] or 0) + (r2["tcp_retransmits"] or 0)
    tx_pkts = nic(r2, lab.dev_a)["tx_packets"] - nic(r0, lab.dev_a)["tx_packets"]
    (path,) = r1["paths"]
    print(f"\nnft {percent}%: seen={seen} dropped={dropped} ({dropped / max(seen, 1):.2%}), "
          f"sent={result['bytes']}B, tx_packets={tx_pkts}, tcp_retransmits={retrans}, "
          f"path={path}")
    assert seen > 500
    assert percent * 0.6 <= 100 * dropped / seen <= percent * 1.4
    # Every dropped segment is sent again (plus some spurious resends after timeouts, measured
    # 1.05-1.6x): the collector's retransmits follow the drops, and its own loss estimate
    # (retransmits / packets sent) is within a band around the rule's N %.
    assert dropped * 0.8 <= retrans <= dropped * 2.5 + 50
    assert percent * 0.5 <= 100 * retrans / tx_pkts <= percent * 2.5
    assert path["peer"] == f"{lab.addr_b}:{PORT}"
    assert path["retransmits"] is not None and path["retransmits"] > 0
    assert path["rtt_ms"] is not None


def test_no_drop_rule_no_retransmits(lab: VethLab) -> None:
    """The control: the same stream without the rule retransmits (almost) nothing."""
    seconds = 1.5
    start_sink(lab)
    coll = NsCollector(lab.a, lab.dev_a, f"{lab.addr_b}:{PORT}")
    r0 = coll.collect()
    send = start_sender(lab, seconds, PACED_BYTES_PER_S)
    sender_result(send, seconds)
    r = coll.collect()
    tx_pkts = nic(r, lab.dev_a)["tx_packets"] - nic(r0, lab.dev_a)["tx_packets"]
    print(f"\nno rule: tcp_retransmits={r['tcp_retransmits']} of tx_packets={tx_pkts}")
    assert r["tcp_retransmits"] is not None and tx_pkts > 1000
    # No loss, but a starved stack still resends a little (0-0.4 % measured with both cores
    # busy): the bound is 1 %, well under the 2.5 % floor the 5 % drop rule's test accepts, so
    # the collector still tells a clean link from a lossy one.
    assert r["tcp_retransmits"] <= tx_pkts * 0.01


# --- (c) throttling --------------------------------------------------------------------------


def _stream_rate(lab: VethLab, coll: NsCollector, seconds: float) -> tuple[float, Json]:
    send = start_sender(lab, seconds)
    time.sleep(seconds * 0.25)
    coll.collect()
    time.sleep(seconds * 0.55)
    r = coll.collect()
    sender_result(send, seconds)
    rate: float = nic(r, lab.dev_a)["tx_bytes_per_s"]
    return rate, r


def test_tbf_throttle_reduces_byte_rate(lab: VethLab) -> None:
    rate_bytes = 1_000_000  # 8mbit
    start_sink(lab)
    coll = NsCollector(lab.a, lab.dev_a, f"{lab.addr_b}:{PORT}")
    free_rate, _ = _stream_rate(lab, coll, 1.5)
    with Tbf(lab.a, lab.dev_a, "8mbit", burst="16kb", latency="100ms"):
        slow_rate, r = _stream_rate(lab, coll, 3.0)
    (path,) = r["paths"]
    print(f"\nunthrottled tx={free_rate / 1e6:.1f} MB/s, tbf 8mbit tx={slow_rate / 1e6:.3f} MB/s, "
          f"path under tbf={path}")
    assert slow_rate <= rate_bytes * 1.5
    assert slow_rate >= rate_bytes * 0.3  # it still flows
    assert free_rate >= 5 * slow_rate


# --- (d) latency and jitter through Toxiproxy ------------------------------------------------


@pytest.fixture(scope="module")
def toxiproxy_bin() -> Any:
    if shutil.which("go") is None and not os.path.exists("/usr/local/go/bin/go") \
            and not os.environ.get("TOXIPROXY_SERVER"):
        pytest.fail("Go is needed to build toxiproxy-server", pytrace=False)
    return ensure_toxiproxy_server()


@pytest.mark.timeout(300)  # the first run builds toxiproxy-server (~1 min on 2 cores)
def test_toxiproxy_latency_raises_peer_rtt(toxiproxy_bin: Any) -> None:
    latency, jitter = 80, 20
    echo = EchoResponder("127.0.0.1")
    try:
        with ToxiproxyServer(toxiproxy_bin) as tp:
            port = tp.create_proxy("peer0", f"127.0.0.1:{echo.port}")
            peer = PeerSpec("127.0.0.1", port=port, probe_port=port, name="peer0")
            coll = NetCollector("this-node", interfaces=["lo"], include_loopback=True,
                                peers=[peer], probe_samples=8, probe_budget_s=5.0)
            try:
                (base,) = coll.collect(now_us()).paths
                toxic = tp.add_latency("peer0", latency, jitter)
                (slow,) = coll.collect(now_us()).paths
                tp.remove_toxic("peer0", toxic)
                (back,) = coll.collect(now_us()).paths
            finally:
                coll.close()
    finally:
        echo.close()
    print(f"\ntoxiproxy latency={latency}ms jitter={jitter}ms: rtt base={base.rtt_ms:.2f}ms "
          f"slow={slow.rtt_ms:.1f}ms (var {slow.rtt_var_ms:.1f}) back={back.rtt_ms:.2f}ms")
    assert base.rtt_ms is not None and slow.rtt_ms is not None and back.rtt_ms is not None
    assert base.rtt_ms < 10
    assert latency - jitter <= slow.rtt_ms - base.rtt_ms <= latency + jitter + 30
    assert slow.rtt_var_ms is not None and slow.rtt_var_ms > 1.0  # the jitter shows
    assert back.rtt_ms < 10
    assert slow.retransmits == 0  # the kernel saw no loss: the delay is above TCP


def test_a_dead_probe_peer_is_counted_and_bounded() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    coll = NetCollector("this-node", interfaces=["lo"], include_loopback=True,
                        peers=[PeerSpec("127.0.0.1", port=port, probe_port=port)],
                        probe_samples=3, probe_budget_s=1.0)
    t0 = time.monotonic()
    r = coll.collect(now_us())
    coll.close()
    assert time.monotonic() - t0 < 3
    assert r.malformed.get("probe_failed") == 3
    assert r.paths[0].rtt_ms is None


def test_a_lab_left_by_a_dead_process_is_swept() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait(timeout=5)
    name = f"tgl-{dead.pid}-deadbeef-a"
    run(["ip", "netns", "add", name])
    try:
        assert name in sweep_stale()
        assert name not in leftovers()
    finally:
        run(["ip", "netns", "del", name], check=False)


# --- the lab cleans up -----------------------------------------------------------------------


def test_lab_leaves_nothing_behind() -> None:
    with VethLab() as lab:
        lab.b.spawn(["sleep", "30"])
        with NftDrop(lab.a, 50, daddr=lab.addr_b):
            pass
        NftDrop(lab.a, 10, daddr=lab.addr_b).__enter__()  # never exited: the ns takes it
        Tbf(lab.a, lab.dev_a, "1mbit").__enter__()
        names = (lab.a.name, lab.b.name)
    assert not set(names) & set(leftovers())
    links = run(["ip", "-o", "link", "show"]).stdout
    assert lab.dev_a not in links and lab.dev_b not in links
