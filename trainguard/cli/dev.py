"""`trainguard dev kafka start|stop|status|kill`: the local real broker;
`trainguard dev slurm start|stop|status`: a real Slurm cluster of network-namespace nodes."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainguard.dev.kafka import KafkaBroker, fetch_kafka
from trainguard.dev.slurm import ClusterSpec, SlurmCluster, SlurmError


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser("dev", help="development services run as local processes")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)
    kafka = dev_sub.add_parser("kafka", help="a real single-node Apache Kafka (KRaft)")
    kafka_sub = kafka.add_subparsers(dest="kafka_command", required=True)
    for name, helptext in (
        ("start", "fetch Kafka if needed, start the broker, wait until it accepts clients"),
        ("stop", "stop the broker cleanly (SIGTERM, then SIGKILL after a grace)"),
        ("kill", "kill the broker hard (SIGKILL), as a crash would"),
        ("status", "print whether the broker runs, and its bootstrap address"),
        ("fetch", "only fetch Kafka's jars into the cache"),
    ):
        p = kafka_sub.add_parser(name, help=helptext)
        p.add_argument("--state-dir", type=Path, help="broker state directory "
                       "(default: $TRAINGUARD_STATE/kafka)")
        if name == "start":
            p.add_argument("--fresh", action="store_true",
                           help="discard existing data and ports, format a new cluster")
            p.add_argument("--timeout", type=float, default=90.0, help="seconds to wait")
        p.set_defaults(func=_run)
    _register_slurm(dev_sub)


def _register_slurm(dev_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    slurm = dev_sub.add_parser("slurm", help="a real Slurm cluster: munge, slurmctld and one "
                               "slurmd per network-namespace node")
    slurm_sub = slurm.add_subparsers(dest="slurm_command", required=True)
    for name, helptext in (
        ("start", "start (or keep) the cluster; sweeps what a crashed run left first"),
        ("stop", "stop every daemon, delete the node namespaces and the bridge"),
        ("status", "print the cluster (conf, nodes, addresses) and each node's Slurm state"),
    ):
        p = slurm_sub.add_parser(name, help=helptext)
        p.add_argument("--state-dir", type=Path, help="cluster state directory "
                       "(default: $TRAINGUARD_STATE/slurm)")
        if name == "start":
            p.add_argument("--nodes", type=int, default=3, help="job nodes (default 3)")
            p.add_argument("--spares", type=int, default=1,
                           help="spare nodes, feature 'spare' (default 1)")
            p.add_argument("--timeout", type=float, default=60.0,
                           help="seconds to wait for every node to be idle")
        p.set_defaults(func=_run_slurm)


def _run_slurm(args: argparse.Namespace) -> int:
    cluster = SlurmCluster(args.state_dir)
    try:
        if args.slurm_command == "start":
            info = cluster.start(ClusterSpec(args.nodes, args.spares), timeout_s=args.timeout)
            print(json.dumps({"status": "running", "conf": info.conf,
                              "shared_dir": info.shared_dir,
                              "nodes": {n.name: n.address for n in info.nodes}}))
            return 0
        if args.slurm_command == "stop":
            print(json.dumps({"status": "stopped" if cluster.stop() else "not running"}))
            return 0
        running = cluster.running()
        if running is None:
            print(json.dumps({"status": "not running", "state_dir": str(cluster.root)}))
            return 3
        states = cluster.node_states()
        print(json.dumps({"status": "running", "conf": running.conf,
                          "nodes": {n.name: {"address": n.address, "netns": n.netns,
                                             "spare": n.spare, "state": states.get(n.name)}
                                    for n in running.nodes}}))
        return 0
    except SlurmError as exc:
        print(f"trainguard dev slurm {args.slurm_command}: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace) -> int:
    broker = KafkaBroker(args.state_dir)
    cmd = args.kafka_command
    if cmd == "fetch":
        print(fetch_kafka())
        return 0
    if cmd == "start":
        info = broker.start(fresh=args.fresh, timeout_s=args.timeout)
        print(json.dumps({"status": "running", "bootstrap": info.bootstrap, "pid": info.pid,
                          "state_dir": info.state_dir, "version": info.version}))
        return 0
    if cmd in ("stop", "kill"):
        stopped = broker.stop() if cmd == "stop" else broker.kill()
        print(json.dumps({"status": "stopped" if stopped else "not running"}))
        return 0
    running = broker.running()
    if running is None:
        print(json.dumps({"status": "not running", "state_dir": str(broker.root)}))
        return 3
    print(json.dumps({"status": "running", "bootstrap": running.bootstrap, "pid": running.pid,
                      "state_dir": running.state_dir, "version": running.version}))
    return 0
