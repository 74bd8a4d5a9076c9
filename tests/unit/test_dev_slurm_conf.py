"""The generated Slurm configuration: pure."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.dev.slurm import ClusterSpec, SlurmError, parse_node_states, slurm_conf

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
