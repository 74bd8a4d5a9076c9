"""Pure parsers of the net collector, on recorded text."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.collectors.net.parse import (
    ib_operstate,
    parse_ib_rate_mbps,
    parse_ib_state,
    parse_int,
    parse_proc_net_dev,
    parse_snmp,
    parse_ss_tin,
    split_addr,
)

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "net"


def test_proc_net_dev_recorded() -> None:
    parsed = parse_proc_net_dev((FIX / "node1" / "proc" / "net" / "dev").read_text())
    assert parsed.malformed == 0
    assert set(parsed.value) == {"lo", "eth0", "ib0", "eth1"}
    eth0 = parsed.value["eth0"]
    assert (eth0.rx_bytes, eth0.rx_packets, eth0.rx_errors, eth0.rx_dropped) == (
        1_000_000_000, 2_000_000, 1, 2)
    assert (eth0.tx_bytes, eth0.tx_packets, eth0.tx_errors, eth0.tx_dropped) == (
        500_000_000, 1_000_000, 0, 3)


def test_proc_net_dev_long_name_and_bad_lines() -> None:
    text = ("Inter-|   Receive |  Transmit\n face |bytes packets|bytes\n"
            "tgrec00001a:  565146    7991    0    0    0     0          0         0 "
            "20833900   13874    0    0    0     0       0          0\n"
            "  bad0: 1 2 3\n  bad1: x 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n")
    parsed = parse_proc_net_dev(text)
    assert parsed.value["tgrec00001a"].tx_bytes == 20833900
    assert parsed.malformed == 2


def test_snmp_tcp() -> None:
    tcp = parse_snmp((FIX / "node1" / "proc" / "net" / "snmp").read_text())
    assert tcp["RetransSegs"] == 680 and tcp["OutSegs"] == 13187 and tcp["MaxConn"] == -1
    assert parse_snmp("Ip: a b\nIp: 1 2\n") == {}
    assert parse_snmp("") == {}


@pytest.mark.parametrize(("text", "want"), [
    ("10000\n", 10000), ("-1\n", -1), ("", None), ("x", None), ("0x10", 16)])
def test_parse_int(text: str, want: int | None) -> None:
    assert parse_int(text) == want


def test_ib_fields() -> None:
    assert parse_ib_state("4: ACTIVE\n") == "ACTIVE"
    assert parse_ib_state("nonsense") is None
    assert ib_operstate("ACTIVE") == "up" and ib_operstate("DOWN") == "down"
    assert ib_operstate(None) is None
    assert parse_ib_rate_mbps("200 Gb/sec (4X HDR)\n") == 200_000.0
    assert parse_ib_rate_mbps("2.5 Gb/sec (1X SDR)") == 2500.0
    assert parse_ib_rate_mbps("fast") is None


@pytest.mark.parametrize(("token", "want"), [
    ("10.0.0.2:5555", ("10.0.0.2", 5555)),
    ("[::1]:22", ("::1", 22)),
    ("[::ffff:10.0.0.2]:80", ("10.0.0.2", 80)),
    ("[fe80::1%eth0]:22", ("fe80::1", 22)),
    ("*:*", None),
    ("10.0.0.2", None),
])
def test_split_addr(token: str, want: tuple[str, int] | None) -> None:
    assert split_addr(token) == want


def test_ss_established_recorded() -> None:
    parsed = parse_ss_tin((FIX / "ss_tinH_established.txt").read_text())
    assert parsed.malformed == 0
    c = parsed.value
    assert [(x.peer, x.peer_port) for x in c] == [
        ("10.228.31.14", 5201), ("10.228.31.14", 5201), ("10.228.31.15", 29500),
        ("fd00::2", 29500)]
    assert (c[0].local, c[0].local_port) == ("10.228.31.13", 49212)
    assert (c[0].rtt_ms, c[0].rtt_var_ms) == (0.479, 0.333)  # not minrtt/mrtt
    assert (c[0].retrans_now, c[0].total_retrans, c[0].lost) == (1, 632, 1)
    assert (c[1].rtt_ms, c[1].total_retrans, c[1].lost) == (4.531, 0, 0)  # not printed = 0
    assert c[2].total_retrans == 3
    assert c[3].rtt_ms == 0.25  # rcv_rtt is not rtt


def test_ss_with_state_column_and_malformed() -> None:
    parsed = parse_ss_tin((FIX / "ss_tin_with_state.txt").read_text())
    assert [(x.peer_port, x.total_retrans) for x in parsed.value] == [(5201, 632)]
    # The bad connection line, and the info line that then has no connection.
    assert parsed.malformed == 2


def test_ss_empty_and_orphan_info() -> None:
    assert parse_ss_tin("").value == []
    assert parse_ss_tin("\t rtt:1/1\n").malformed == 1
