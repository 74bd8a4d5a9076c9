"""The generated Slurm configuration: pure."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.dev.slurm import (
    AgentPlan,
    ClusterInfo,
    ClusterSpec,
    Node,
    SlurmError,
    agent_argv,
    bridge_listeners,
    node_links,
    parse_node_states,
    slurm_conf,
)

pytestmark = pytest.mark.unit


def test_conf_names_every_node_on_the_bridge_and_marks_spares() -> None:
    text = slurm_conf(ClusterSpec(3, 1), Path("/s"), "vm", Path("/run/m.sock"))
    nodes = [ln for ln in text.splitlines() if ln.startswith("NodeName=")]
    assert nodes == [
        "NodeName=tgn1 NodeAddr=10.252.0.11 CPUs=2 State=UNKNOWN",
        "NodeName=tgn2 NodeAddr=10.252.0.12 CPUs=2 State=UNKNOWN",
        "NodeName=tgn3 NodeAddr=10.252.0.13 CPUs=2 State=UNKNOWN",
        "NodeName=tgn4 NodeAddr=10.252.0.14 CPUs=2 Features=spare State=UNKNOWN",
    ]
    assert "SlurmctldHost=vm(10.252.0.1)" in text
    assert "AuthInfo=socket=/run/m.sock" in text
    assert "SlurmdSpoolDir=/s/spool/%n" in text


@given(st.integers(1, 150), st.integers(0, 50))
def test_addresses_are_distinct_and_on_the_subnet(nodes: int, spares: int) -> None:
    spec = ClusterSpec(nodes, spares)
    addrs = [spec.address(n) for n in spec.names]
    assert len(set(addrs)) == nodes + spares
    assert all(a.startswith("10.252.0.") and 11 <= int(a.rsplit(".", 1)[1]) <= 254
               for a in addrs)


@pytest.mark.parametrize("nodes,spares", [(0, 1), (1, -1), (150, 51)])
def test_bad_sizes_are_one_line_errors(nodes: int, spares: int) -> None:
    with pytest.raises(SlurmError, match="nodes"):
        ClusterSpec(nodes, spares)


def test_node_states_parse_sinfo() -> None:
    assert parse_node_states("tgn1 idle\ntgn2 down*\n\ngarbage\n") == {"tgn1": "idle",
                                                                       "tgn2": "down*"}


def test_the_nodes_reach_the_broker_on_the_bridge_and_the_head_on_loopback() -> None:
    props = bridge_listeners(9092, 9093, 9094)
    assert props["listeners"] == ("PLAINTEXT://127.0.0.1:9092,NODES://10.252.0.1:9093,"
                                  "CONTROLLER://127.0.0.1:9094")
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9092,NODES://10.252.0.1:9093"
    assert "NODES:PLAINTEXT" in props["listener.security.protocol.map"].split(",")


def test_each_agent_runs_in_its_namespace_with_its_own_spool_and_socket() -> None:
    argv = agent_argv("tgn2", Path("/s"), "10.252.0.1:9093", "tg", 1.0, python="py")
    assert argv[:5] == ["ip", "netns", "exec", "tgs-tgn2", "py"]
    opts = dict(zip(argv[8::2], argv[9::2], strict=False))
    assert opts["--node"] == "tgn2" and opts["--bootstrap"] == "10.252.0.1:9093"
    assert opts["--spool-dir"] == "/s/agents/tgn2/spool"
    assert opts["--socket"] == "/s/agents/tgn2/agent.sock"
    assert opts["--gpu"] == "none" and "--no-kernel-log" in argv  # one kernel for every node


def test_cluster_info_round_trips_with_and_without_agents() -> None:
    nodes = (Node("tgn1", "10.252.0.11", "tgs-tgn1", False, "/s/agents/tgn1/agent.sock"),)
    info = ClusterInfo("/s/etc/slurm.conf", "/s/shared", "10.252.0.1", nodes, 7, "/m", 1.0,
                       agents_bootstrap="10.252.0.1:9093", agents_prefix="tg")
    doc = json.loads(json.dumps(asdict(info)))  # as cluster.json holds it
    assert ClusterInfo.from_json(doc) == info
    old = doc
    for key in ("agents_bootstrap", "agents_prefix", "agents_interval_s"):
        del old[key]
    del old["nodes"][0]["agent_socket"]  # a cluster.json written before agents
    assert ClusterInfo.from_json(old).agents_bootstrap is None


def test_an_agent_interval_below_the_agents_own_minimum_is_refused() -> None:
    with pytest.raises(SlurmError, match="interval_s"):
        AgentPlan(interval_s=0.01)


def test_node_links_are_found_in_ip_link_show_output() -> None:
    shown = ("1: lo: <LOOPBACK,UP> mtu 65536 qdisc noqueue state UNKNOWN\n"
             "7: tgsv1@if2: <BROADCAST,MULTICAST> mtu 1500 master tgsbr0 state DOWN\n"
             "8: tgsbr0: <BROADCAST,MULTICAST,UP> mtu 1500 state UP\n"
             "9: tgsv12@if3: <BROADCAST> mtu 1500 state DOWN\n"
             "10: tgsvx@if4: <BROADCAST> mtu 1500\n")
    assert node_links(shown) == ["tgsv1", "tgsv12"]
    assert node_links("") == []
