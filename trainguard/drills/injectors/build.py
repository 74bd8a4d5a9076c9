"""The injector for a scenario's fault, from what the running drill knows: the rank processes
(census), the node's units, the checkpoint file system, the broker."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainguard.dev import slurm
from trainguard.dev.kafka import KafkaBroker
from trainguard.drills.injectors import (
    broker,
    checkpoint,
    cluster,
    link,
    signals,
    slowdown,
    storage,
)
from trainguard.drills.injectors.base import InjectionError, Injector
from trainguard.drills.scenario import CLUSTER_ONLY, Fault
from trainguard.netlab import VethLab


@dataclass
class Target:
    """Where the drill can act. ``pids(ranks)`` gives the live processes of those ranks."""

    pids: Callable[[set[int] | None], list[int]]
    node_ranks: Callable[[str], set[int]]
    ckpt_root: Path
    mountpoint: Path
    image: Path | None  # the loop image under ``mountpoint`` (None: a plain directory)
    broker: KafkaBroker
    tag: str
    lab: VethLab | None = None
    cluster_nodes: Mapping[str, tuple[str, str]] | None = None  # node -> (netns, host veth)


def _one(target: Target, rank: int) -> int:
    pids = target.pids({rank})
    if len(pids) != 1:
        raise InjectionError(f"rank {rank}: expected one live process, found {pids}")
    return pids[0]


def build(fault: Fault, target: Target, rollback: str = "none") -> Injector:
    p = fault.params
    if fault.kind == "worker_exit":
        assert fault.rank is not None
        return signals.WorkerExit(_one(target, fault.rank), str(p["signal"]))
    if fault.kind == "hang":
        assert fault.rank is not None
        return signals.Hang(_one(target, fault.rank))
    if fault.kind == "slowdown":
        assert fault.rank is not None
        pid = _one(target, fault.rank)
        if p["method"] == "cgroup":
            return slowdown.CgroupThrottle(pid, float(p["cpu_pct"]), target.tag)
        return signals.StopDuty(pid, int(p["stop_ms"]), int(p["run_ms"]))
    if fault.kind == "node_loss":
        assert fault.node is not None
        ranks = target.node_ranks(fault.node)
        return signals.NodeLoss(target.pids(ranks), str(p["signal"]), fault.node)
    if fault.kind == "cluster_head_partition":
        if not target.cluster_nodes:
            raise InjectionError("cluster_head_partition: the drill has no Slurm cluster")
        return cluster.HeadPartition(
            slurm.BRIDGE, slurm.HEAD_ADDR,
            {node: netns for node, (netns, _) in target.cluster_nodes.items()})
    if fault.kind in CLUSTER_ONLY:
        assert fault.node is not None
        if target.cluster_nodes is None or fault.node not in target.cluster_nodes:
            raise InjectionError(f"node {fault.node!r}: not a node of the drill's Slurm "
                                 f"cluster ({sorted(target.cluster_nodes or {})})")
        netns, veth = target.cluster_nodes[fault.node]
        if fault.kind == "cluster_partition":
            return cluster.ClusterPartition(fault.node, netns, veth)
        loss = cluster.ClusterNodeLoss(fault.node, netns, veth)
        if fault.kind == "cluster_node_loss":
            return loss
        return cluster.InOutage(broker.BrokerOutage(target.broker, str(p["mode"])), loss)
    if fault.kind in ("storage_stall", "storage_loss") and target.image is None:
        raise InjectionError(f"{fault.kind}: {target.mountpoint} is a plain directory, not "
                             "the drill's loop-mounted file system")
    if fault.kind == "storage_stall":
        return storage.FsFreeze(target.mountpoint)
    if fault.kind == "storage_loss":
        assert target.image is not None
        return storage.ReadOnly(target.mountpoint, str(p["method"]), target.image)
    if fault.kind == "checkpoint_corruption":
        return checkpoint.CorruptNewest(target.ckpt_root, str(p["mode"]),
                                        keep_copy=rollback == "restore_copy")
    if fault.kind == "broker_outage":
        return broker.BrokerOutage(target.broker, str(p["mode"]))
    if fault.kind == "link" and p.get("mode") != "latency":
        return link.link_injector(target.lab, dict(p))
    raise InjectionError(f"{fault.kind} {dict(p)}: not injectable into the full loop here "
                         "(docs/drills.md)")
