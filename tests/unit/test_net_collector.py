"""``NetCollector`` on the recorded fake tree (tests/fixtures/net/node1), copied per test."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from trainguard.collectors.net import NetCollector, PeerSpec
from trainguard.collectors.net.peers import ss_args
from trainguard.events.payloads import NicSample, NodeHealth, NodeHealthKind

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "net"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "node1"
    shutil.copytree(FIX / "node1", root)
    return root


def make(tree: Path, clock: Clock, **kw: object) -> NetCollector:
    return NetCollector("n1", sys_root=tree / "sys", proc_root=tree / "proc", clock=clock,
                        ss_runner=None, **kw)  # type: ignore[arg-type]


def nics(reading_nics: Sequence[NicSample]) -> dict[str, NicSample]:
    return {n.name: n for n in reading_nics}


def set_dev(tree: Path, name: str, col: int, value: int) -> None:
    """Set column ``col`` (0 = rx_bytes, 8 = tx_bytes...) of ``name`` in proc/net/dev."""
    p = tree / "proc" / "net" / "dev"
    out = []
    for line in p.read_text().splitlines():
        head, sep, rest = line.partition(":")
        if sep and head.strip() == name:
            f = rest.split()
            f[col] = str(value)
            line = f"{head}: {' '.join(f)}"
        out.append(line)
    p.write_text("\n".join(out) + "\n")


def test_first_collect_has_counters_state_and_no_rates(tree: Path) -> None:
    r = make(tree, Clock()).collect(1)
    n = nics(r.nics)
    assert set(n) == {"eth0", "eth1", "ib0", "mlx5_0/1", "mlx5_1/1"}  # no lo by default
    eth0 = n["eth0"]
    assert (eth0.kind, eth0.operstate, eth0.carrier, eth0.carrier_changes, eth0.speed_mbps) == (
        "ethernet", "up", True, 2, 25000.0)
    assert (eth0.rx_bytes, eth0.tx_dropped) == (1_000_000_000, 3)
    assert eth0.rx_bytes_per_s is None and eth0.tx_packets_per_s is None
    eth1 = n["eth1"]
    assert (eth1.operstate, eth1.carrier, eth1.speed_mbps) == ("down", None, None)
    assert r.tcp_retransmits is None  # first read: no interval yet
    assert r.discrete == []
    # eth1 has no carrier file in the fake tree (a real down link answers EINVAL instead)
    assert r.malformed == {"carrier": 1}


def test_rates_between_two_collects(tree: Path) -> None:
    clock = Clock()
    c = make(tree, clock)
    c.collect(1)
    set_dev(tree, "eth0", 0, 1_000_000_000 + 2_500_000)  # rx_bytes
    set_dev(tree, "eth0", 1, 2_000_000 + 2000)  # rx_packets
    set_dev(tree, "eth0", 8, 500_000_000 + 500_000)  # tx_bytes
    clock.t += 0.5
    eth0 = nics(c.collect(2).nics)["eth0"]
    assert eth0.rx_bytes_per_s == pytest.approx(5_000_000)
    assert eth0.rx_packets_per_s == pytest.approx(4000)
    assert eth0.tx_bytes_per_s == pytest.approx(1_000_000)
    assert eth0.tx_packets_per_s == 0


def test_wrap_and_reset_never_give_negative_rates(tree: Path) -> None:
    clock = Clock()
    c = make(tree, clock)
    c.collect(1)
    set_dev(tree, "ib0", 0, 200)  # 4294967000 -> 200: a 32-bit wrap of 496 bytes
    set_dev(tree, "eth0", 0, 10)  # 1e9 -> 10: a reset
    clock.t += 1.0
    n = nics(c.collect(2).nics)
    assert n["ib0"].rx_bytes_per_s == pytest.approx(496)
    assert n["eth0"].rx_bytes_per_s is None
    clock.t += 1.0
    set_dev(tree, "eth0", 0, 1010)
    assert nics(c.collect(3).nics)["eth0"].rx_bytes_per_s == pytest.approx(1000)


def test_recreated_interface_restarts_its_rates(tree: Path) -> None:
    clock = Clock()
    c = make(tree, clock)
    c.collect(1)
    (tree / "sys/class/net/eth0/ifindex").write_text("9\n")
    set_dev(tree, "eth0", 0, 1_000_000_000 + 100)
    clock.t += 1
    assert nics(c.collect(2).nics)["eth0"].rx_bytes_per_s is None


def test_tcp_retransmits_is_the_interval_delta(tree: Path) -> None:
    clock = Clock()
    c = make(tree, clock)
    snmp = tree / "proc/net/snmp"
    c.collect(1)
    snmp.write_text(snmp.read_text().replace(" 13187 680 ", " 14000 712 "))
    assert c.collect(2).tcp_retransmits == 32


def test_missing_files_never_raise_and_are_counted(tree: Path) -> None:
    (tree / "proc/net/dev").unlink()
    (tree / "proc/net/snmp").write_text("Tcp: garbage\n")
    (tree / "sys/class/net/eth0/operstate").unlink()
    (tree / "sys/class/net/eth0/carrier").write_text("yes\n")
    (tree / "sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error").write_text("many\n")
    (tree / "sys/class/infiniband/mlx5_0/ports/1/state").write_text("???\n")
    r = make(tree, Clock()).collect(1)
    eth0 = nics(r.nics)["eth0"]
    assert (eth0.operstate, eth0.carrier, eth0.rx_bytes) == (None, None, None)
    assert r.malformed == {"proc_net_dev": 1, "proc_net_snmp": 1, "operstate": 1,
                           "carrier": 2, "ib_counter": 1, "ib_state": 1}
    assert "symbol_error" not in nics(r.nics)["mlx5_0/1"].ib_counters


def test_an_empty_root_gives_an_empty_reading(tmp_path: Path) -> None:
    r = NetCollector("n1", sys_root=tmp_path / "nosys", proc_root=tmp_path / "noproc",
                     ss_runner=None).collect(1)
    assert r.nics == [] and r.tcp_retransmits is None
    assert r.malformed == {"proc_net_dev": 1, "proc_net_snmp": 1}


def test_ib_ports(tree: Path) -> None:
    n = nics(make(tree, Clock()).collect(1).nics)
    ib = n["mlx5_0/1"]
    assert (ib.kind, ib.operstate, ib.carrier, ib.speed_mbps) == ("infiniband", "up", True,
                                                                  200_000.0)
    assert ib.ib_counters["link_downed"] == 1
    assert ib.ib_counters["symbol_error"] == 12
    assert ib.ib_counters["port_xmit_discards"] == 40
    assert ib.ib_counters["link_error_recovery"] == 2
    assert ib.ib_counters["out_of_buffer"] == 17  # from hw_counters
    roce = n["mlx5_1/1"]
    assert (roce.kind, roce.operstate, roce.speed_mbps) == ("infiniband", "down", 100_000.0)
    assert roce.ib_counters == {"link_downed": 0, "symbol_error": 0, "port_rcv_errors": 0}
    assert not make(tree, Clock(), include_infiniband=False).collect(1).nics[-1].name.startswith(
        "mlx5")


def health(r_discrete: Sequence[object]) -> list[tuple[NodeHealthKind, str | None, int | None]]:
    out = []
    for d in r_discrete:
        p = getattr(d, "payload", None)
        assert isinstance(p, NodeHealth)
        out.append((p.kind, p.device, p.code))
    return out


def test_link_events_from_sysfs_and_ib(tree: Path) -> None:
    c = make(tree, Clock())
    c.collect(1)
    net = tree / "sys/class/net"
    (net / "eth0/operstate").write_text("down\n")
    (net / "eth0/carrier_changes").write_text("3\n")
    (net / "ib0/carrier_changes").write_text("8\n")  # flapped twice, up again
    port = tree / "sys/class/infiniband/mlx5_0/ports/1"
    (port / "counters/link_downed").write_text("2\n")
    r = c.collect(2)
    assert health(r.discrete) == [
        (NodeHealthKind.LINK_DOWN, "eth0", 1),
        (NodeHealthKind.LINK_DOWN, "ib0", 4), (NodeHealthKind.LINK_UP, "ib0", 4),
        (NodeHealthKind.LINK_DOWN, "mlx5_0/1", 1), (NodeHealthKind.LINK_UP, "mlx5_0/1", 1)]
    d = r.discrete[0]
    assert (d.job_id, d.event_time, d.subject.node, d.subject.link) == ("node:n1", 2, "n1",
                                                                         "eth0")
    (port / "state").write_text("1: DOWN\n")
    assert health(c.collect(3).discrete) == [(NodeHealthKind.LINK_DOWN, "mlx5_0/1", None)]


def test_interface_filter_and_loopback(tree: Path) -> None:
    assert [n.name for n in make(tree, Clock(), interfaces=["lo"]).collect(1).nics
            if n.kind != "infiniband"] == ["lo"]
    names = [n.name for n in make(tree, Clock(), include_loopback=True).collect(1).nics]
    assert "lo" in names and nics(make(tree, Clock(), include_loopback=True).collect(1).nics)[
        "lo"].kind == "other"


# --- peers ------------------------------------------------------------------------------------


class FakeSs:
    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.argv: list[Sequence[str]] = []

    def __call__(self, argv: Sequence[str]) -> str:
        self.argv.append(argv)
        return self.texts.pop(0)


def test_peer_paths_from_ss(tree: Path) -> None:
    text = (FIX / "ss_tinH_established.txt").read_text()
    second = text.replace("retrans:1/632", "retrans:0/700")
    ss = FakeSs([text, second])
    peers = [PeerSpec("10.228.31.14", port=5201), PeerSpec("10.228.31.15"),
             PeerSpec("fd00::2", name="v6peer"), PeerSpec("10.9.9.9")]
    c = NetCollector("n1", sys_root=tree / "sys", proc_root=tree / "proc", peers=peers,
                     ss_runner=ss, clock=Clock())
    p = {x.peer: x for x in c.collect(1).paths}
    assert list(p) == ["10.228.31.14:5201", "10.228.31.15", "v6peer", "10.9.9.9"]
    a = p["10.228.31.14:5201"]
    # Worst of its two connections (4.531 ms), retransmits in full for new connections.
    assert (a.rtt_ms, a.rtt_var_ms, a.retransmits, a.lost) == (4.531, 0.055, 632, 1)
    assert (p["10.228.31.15"].rtt_ms, p["10.228.31.15"].retransmits) == (1.5, 3)
    assert p["v6peer"].rtt_ms == 0.25
    none = p["10.9.9.9"]
    assert (none.rtt_ms, none.retransmits, none.lost) == (None, None, None)
    p2 = {x.peer: x for x in c.collect(2).paths}
    assert p2["10.228.31.14:5201"].retransmits == 68  # 700 - 632 during the interval
    assert p2["10.228.31.15"].retransmits == 0
    assert ss.argv[0] == ss_args(peers)


def test_ss_args() -> None:
    assert ss_args([PeerSpec("10.0.0.2", port=5201), PeerSpec("fd00::2")]) == [
        "ss", "-tinH", "state", "established", "(", "dst", "10.0.0.2:5201", "or", "dst",
        "[fd00::2]", ")"]
    assert ss_args([]) == ["ss", "-tinH", "state", "established"]


def test_ss_failure_is_counted_not_raised(tree: Path) -> None:
    def broken(argv: Sequence[str]) -> str:
        raise subprocess.CalledProcessError(1, list(argv))

    c = NetCollector("n1", sys_root=tree / "sys", proc_root=tree / "proc",
                     peers=[PeerSpec("10.0.0.2")], ss_runner=broken)
    r = c.collect(1)
    assert r.malformed.get("ss") == 1
    assert [(x.peer, x.rtt_ms, x.retransmits) for x in r.paths] == [("10.0.0.2", None, None)]


def test_cli_peer_syntax_and_json(tree: Path) -> None:
    from trainguard.collectors.net.cli import parse_peer, reading_to_json

    assert parse_peer("10.0.0.2") == PeerSpec("10.0.0.2")
    assert parse_peer("10.0.0.2:5201/7000") == PeerSpec("10.0.0.2", port=5201, probe_port=7000)
    assert parse_peer("[fd00::2]:29500") == PeerSpec("fd00::2", port=29500)
    assert parse_peer("fd00::2") == PeerSpec("fd00::2")
    c = make(tree, Clock())
    c.collect(1)
    (tree / "sys/class/net/eth0/operstate").write_text("down\n")
    out = reading_to_json(c.collect(2))
    assert out["discrete"][0]["kind"] == "link_down"
    assert out["discrete"][0]["_type"] == "NodeHealth"
    assert {n["name"] for n in out["nics"]} >= {"eth0", "mlx5_0/1"}
