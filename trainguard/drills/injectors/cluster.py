"""Faults of a node of the dev Slurm cluster.

``ClusterNodeLoss``: the node lost as nodes go: its link downed, then every process of its
network namespace killed (slurmd, the node's agent, the job's ranks), in that order, so that
nothing of it gets a last word out. ``undo`` leaves it lost (the drill's teardown brings the
node back); it is held by nobody.

``ClusterPartition``: the node cut off the network with everything on it still running (a
switch port or a cable gone): nftables ``netdev`` ingress chains that drop every packet, one on
the bridge end of its link (what it sends), one on its ``eth0`` inside its namespace (what it
receives). Silent loss both ways, as on a wire: no sender learns of it from its own stack
(an ``output`` drop would fail its sends at once with EPERM). ``undo`` deletes both tables: the
node is heard again, and Slurm tells its slurmd to end what it no longer lists.

``HeadPartition``: the head (the broker, slurmctld, the loop's services, the ranks' ``srun``)
cut off from every node while the nodes still reach each other (the head's uplink lost): a
``netdev`` ingress chain on the bridge device drops every frame the bridge passes up to the
head (the frames it forwards between nodes never pass there), and one on each node's ``eth0``
drops what comes from the head's address. Silent both ways; ``undo`` deletes every table.

``InOutage``: a fault injected while the broker is away (a node lost during a control-plane
outage)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from trainguard.dev.slurm import SlurmError, power_off
from trainguard.drills.injectors.base import Acted, InjectionError, Injector
from trainguard.events.clock import now_us


class ClusterNodeLoss:
    def __init__(self, node: str, netns: str, veth: str) -> None:
        self.node, self.netns, self.veth = node, netns, veth

    def inject(self) -> Acted:
        t = now_us()
        try:
            killed: list[str | int | float | bool | None] = list(power_off(self.netns,
                                                                            self.veth))
        except SlurmError as exc:
            raise InjectionError(f"node {self.node}: {exc}") from None
        if not killed:
            raise InjectionError(f"node {self.node}: nothing ran in {self.netns}")
        return Acted(t, {"node": self.node, "link": f"{self.veth} down", "pids": killed,
                         "signal": "SIGKILL", "spread_us": now_us() - t})

    def undo(self) -> Acted:
        return Acted.now(node=self.node, undo="none: a lost node stays lost until the drill's "
                         "teardown brings it back")


def partition_table(device: str) -> str:
    """One table per device: two partitioned nodes never share (or delete) one."""
    return f"tg_partition_{device}"


def _nft(prefix: Sequence[str], script: str, what: str) -> None:
    done = subprocess.run([*prefix, "nft", "-f", "-"], input=script, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise InjectionError(f"{what}: nft: {done.stderr.strip()}")


def drop_all(device: str, table: str | None = None) -> str:
    """An nft script: a ``netdev`` table (``partition_table(device)`` unless named) whose
    ingress chain on ``device`` drops everything."""
    return (f"table netdev {table or partition_table(device)} {{\n"
            f"  chain in {{ type filter hook ingress device \"{device}\" priority 0; "
            f"policy drop; }}\n}}\n")


class ClusterPartition:
    def __init__(self, node: str, netns: str, veth: str) -> None:
        self.node, self.netns, self.veth = node, netns, veth
        self.sides: list[tuple[tuple[str, ...], str]] = []  # (command prefix, device) in place

    def inject(self) -> Acted:
        for prefix, device in (((), self.veth), (("ip", "netns", "exec", self.netns), "eth0")):
            _nft(prefix, drop_all(device), f"node {self.node}: partition {device}")
            self.sides.append((prefix, device))
        return Acted.now(node=self.node, partition=f"{self.veth} and {self.netns}:eth0 "
                         "ingress dropped", processes="left running")

    def undo(self) -> Acted:
        errors = []
        for prefix, device in self.sides:
            done = subprocess.run([*prefix, "nft", "delete", "table", "netdev",
                                   partition_table(device)],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                errors.append(done.stderr.strip())
        self.sides = []
        if errors:
            raise InjectionError(f"node {self.node}: partition not lifted: {'; '.join(errors)}")
        return Acted.now(node=self.node, undo="partition lifted")


HEAD_TABLE = "tg_head_partition"


def drop_from(device: str, address: str) -> str:
    """An nft script: a ``netdev`` table whose ingress chain on ``device`` drops what comes
    from ``address`` (everything else passes)."""
    return (f"table netdev {HEAD_TABLE} {{\n"
            f"  chain in {{ type filter hook ingress device \"{device}\" priority 0; "
            f"policy accept; ip saddr {address} drop; }}\n}}\n")


class HeadPartition:
    def __init__(self, bridge: str, head_address: str, nodes: dict[str, str]) -> None:
        """``nodes``: node name -> its network namespace."""
        self.bridge, self.head_address, self.nodes = bridge, head_address, dict(nodes)
        self.sides: list[tuple[tuple[str, ...], str]] = []  # (command prefix, what) in place

    def inject(self) -> Acted:
        try:
            _nft((), drop_all(self.bridge, HEAD_TABLE), f"head partition: {self.bridge}")
            self.sides.append(((), self.bridge))
            for node, netns in sorted(self.nodes.items()):
                prefix = ("ip", "netns", "exec", netns)
                _nft(prefix, drop_from("eth0", self.head_address),
                     f"head partition: node {node}")
                self.sides.append((prefix, node))
        except InjectionError:
            self.undo()
            raise
        return Acted.now(head=self.head_address, bridge=self.bridge,
                         nodes=",".join(sorted(self.nodes)),
                         partition="the head cut off from every node; nodes reach each other")

    def undo(self) -> Acted:
        errors = []
        for prefix, what in self.sides:
            done = subprocess.run([*prefix, "nft", "delete", "table", "netdev", HEAD_TABLE],
                                  capture_output=True, text=True, check=False)
            if done.returncode != 0:
                errors.append(f"{what}: {done.stderr.strip()}")
        lifted = len(self.sides)
        self.sides = []
        if errors:
            raise InjectionError(f"head partition not lifted: {'; '.join(errors)}")
        return Acted.now(undo="head partition lifted", tables=lifted)


class InOutage:
    """``fault`` injected while the broker is away: the outage first, then the fault (its time
    is the fault's); ``undo`` brings the broker back and undoes the fault. Whatever the nodes'
    agents saw meanwhile is in their spools; the lost node's never comes."""

    def __init__(self, outage: Injector, fault: Injector) -> None:
        self.outage, self.fault = outage, fault

    def inject(self) -> Acted:
        away = self.outage.inject()
        try:
            acted = self.fault.inject()
        except InjectionError:
            self.outage.undo()
            raise
        return Acted(acted.at_us, {**acted.params,
                                   **{f"broker_{k}": v for k, v in away.params.items()}})

    def undo(self) -> Acted:
        back = self.outage.undo()
        fault = self.fault.undo()
        return Acted(back.at_us, {**fault.params,
                                  **{f"broker_{k}": v for k, v in back.params.items()}})
