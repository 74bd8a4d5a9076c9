"""`trainguard dev kafka start|stop|status|kill|fetch|env|acls`: the local real broker (or a
3-broker cluster); `trainguard dev slurm start|stop|status`: a real Slurm cluster of
network-namespace nodes."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from trainguard.bus.acl import ADMIN_USER, acl_bindings
from trainguard.cli.flags import renamed
from trainguard.dev.cluster import ClusterInfo, KafkaCluster
from trainguard.dev.kafka import USERS, BrokerError, KafkaBroker, fetch_kafka
from trainguard.dev.slurm import AgentPlan, ClusterSpec, SlurmCluster, SlurmError


def _default_prefix() -> str:
    return os.environ.get("TRAINGUARD_KAFKA_TOPIC_PREFIX") or "tg"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    dev = sub.add_parser("dev", help="development services run as local processes")
    dev_sub = dev.add_subparsers(dest="dev_command", required=True)
    kafka = dev_sub.add_parser("kafka", help="a real Apache Kafka (KRaft): one node, or a "
                               "replicated cluster with --brokers")
    kafka_sub = kafka.add_subparsers(dest="kafka_command", required=True)
    for name, helptext in (
        ("start", "fetch Kafka if needed, start the broker, wait until it accepts clients"),
        ("stop", "stop the broker cleanly (SIGTERM, then SIGKILL after a grace)"),
        ("kill", "kill the broker hard (SIGKILL), as a crash would"),
        ("status", "print whether the broker runs, and its bootstrap address"),
        ("fetch", "only fetch Kafka's jars into the cache"),
        ("env", "print the TRAINGUARD_KAFKA_* exports that connect as one principal"),
        ("acls", "create (or --list) the registry's ACLs for a topic prefix on a secured "
                 "broker"),
    ):
        p = kafka_sub.add_parser(name, help=helptext)
        p.add_argument("--state-dir", type=Path, help="broker state directory "
                       "(default: $TRAINGUARD_STATE/kafka)")
        if name in ("start", "env", "acls"):
            p.add_argument("--prefix", default=None, help="topic prefix (default: "
                           "$TRAINGUARD_KAFKA_TOPIC_PREFIX or 'tg')")
        if name == "start":
            p.add_argument("--fresh", action="store_true",
                           help="discard existing data and ports, format a new cluster")
            renamed(p, p.add_argument("--timeout-s", type=float, default=90.0,
                                      help="seconds to wait for the broker (default 90)"),
                    "--timeout")
            p.add_argument("--secure", action="store_true",
                           help="SASL/SCRAM-SHA-512 on the client listener, ACLs from the "
                                "topic registry, one principal per service (needs a new "
                                "cluster: --fresh unless the data was formatted secured)")
            p.add_argument("--brokers", type=int, default=1, metavar="N",
                           help="N combined broker+controller nodes (default 1); with N > 1 "
                                "topics and changelogs get N replicas and min.insync.replicas "
                                "--min-insync")
            p.add_argument("--min-insync", type=int, default=None, metavar="M",
                           help="min.insync.replicas of a cluster (default 2 of 3; 1 on one "
                                "broker)")
        if name == "env":
            p.add_argument("user", nargs="?", choices=USERS, default=None,
                           help="the principal to connect as (a secured broker)")
        if name == "acls":
            p.add_argument("--list", action="store_true",
                           help="print the rules instead of creating them (no broker)")
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
            renamed(p, p.add_argument("--timeout-s", type=float, default=60.0,
                                      help="seconds to wait for every node to be idle "
                                      "(default 60)"), "--timeout")
            p.add_argument("--agents", action="store_true",
                           help="run a trainguard agent in every node, publishing to a broker "
                           "on the head's bridge address (the cluster's own unless "
                           "--agents-bootstrap)")
            p.add_argument("--agents-bootstrap", metavar="HOST:PORT",
                           help="with --agents: a broker the namespaces reach, with the topics")
            p.add_argument("--prefix", default="tg", help="with --agents: topic prefix")
        p.set_defaults(func=_run_slurm)
    p = slurm_sub.add_parser("power-off", help="what a BMC power-off does to NODE: its link "
                             "down, every process of its namespace killed (the slurm "
                             "backend's --fence-command here)")
    p.add_argument("node", help="the node's Slurm name (tgnI)")
    p.add_argument("--state-dir", type=Path, help="cluster state directory "
                   "(default: $TRAINGUARD_STATE/slurm)")
    p.set_defaults(func=_run_slurm)


def _run_slurm(args: argparse.Namespace) -> int:
    cluster = SlurmCluster(args.state_dir)
    try:
        if args.slurm_command == "start":
            if args.agents_bootstrap and not args.agents:
                raise SlurmError("--agents-bootstrap: only with --agents")
            plan = AgentPlan(args.agents_bootstrap, args.prefix) if args.agents else None
            info = cluster.start(ClusterSpec(args.nodes, args.spares), timeout_s=args.timeout_s,
                                 agents=plan)
            print(json.dumps({"status": "running", "conf": info.conf,
                              "shared_dir": info.shared_dir,
                              "nodes": {n.name: n.address for n in info.nodes},
                              "agents_bootstrap": info.agents_bootstrap,
                              "agents_prefix": info.agents_prefix}))
            return 0
        if args.slurm_command == "power-off":
            print(json.dumps({"node": args.node, "killed": cluster.power_off(args.node)}))
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
                          "agents_bootstrap": running.agents_bootstrap,
                          "nodes": {n.name: {"address": n.address, "netns": n.netns,
                                             "spare": n.spare, "state": states.get(n.name),
                                             "agent_pid": cluster.agent_pid(n.name),
                                             "agent_socket": n.agent_socket}
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
    cluster = KafkaCluster(args.state_dir)
    running_cluster = cluster.running() if cmd == "start" and args.brokers == 1 else None
    if running_cluster is not None and not args.fresh:  # the running cluster is the broker
        print(json.dumps(_cluster_status(running_cluster)))
        return 0
    if (cmd == "start" and args.brokers > 1) or (cmd != "start" and cluster.info_file.exists()):
        return _run_cluster(args, cluster)
    if cmd == "start":
        prefix = args.prefix or _default_prefix()
        try:
            info = broker.start(fresh=args.fresh, timeout_s=args.timeout_s,
                                secure=True if args.secure else None)
            rules = broker.grant(prefix) if info.secure else 0
        except BrokerError as exc:
            print(f"trainguard dev kafka start: {str(exc).splitlines()[0]}")
            return 1
        out: dict[str, object] = {"status": "running", "bootstrap": info.bootstrap,
                                  "pid": info.pid, "state_dir": info.state_dir,
                                  "version": info.version, "secure": info.secure}
        if info.secure:
            out.update({"credentials": str(info.credentials_dir()), "acl_prefix": prefix,
                        "acl_rules": rules})
        print(json.dumps(out))
        return 0
    if cmd in ("stop", "kill"):
        stopped = broker.stop() if cmd == "stop" else broker.kill()
        print(json.dumps({"status": "stopped" if stopped else "not running"}))
        return 0
    if cmd == "acls":
        prefix = args.prefix or _default_prefix()
        if args.list:
            for binding in acl_bindings(prefix):
                print(binding.describe())
            return 0
        try:
            print(json.dumps({"acl_prefix": prefix, "acl_rules": broker.grant(prefix)}))
        except BrokerError as exc:
            print(f"trainguard dev kafka acls: {exc}")
            return 1
        return 0
    running = broker.running()
    if running is None:
        if cmd == "env":
            print(f"trainguard dev kafka env: no broker runs under {broker.root}")
            return 3
        print(json.dumps({"status": "not running", "state_dir": str(broker.root)}))
        return 3
    if cmd == "env":
        if running.secure and args.user is None:
            print("trainguard dev kafka env: the broker is secured: name the USER to connect as")
            return 2
        env = running.client_env(args.user or ADMIN_USER, args.prefix or _default_prefix())
        for key, value in env.items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    print(json.dumps({"status": "running", "bootstrap": running.bootstrap, "pid": running.pid,
                      "state_dir": running.state_dir, "version": running.version,
                      "secure": running.secure}))
    return 0


def _run_cluster(args: argparse.Namespace, cluster: KafkaCluster) -> int:
    cmd = args.kafka_command
    if cmd == "start":
        if args.secure:
            print("trainguard dev kafka start: --secure runs on one broker only (not with "
                  "--brokers)")
            return 2
        try:
            cluster = KafkaCluster(args.state_dir, size=args.brokers,
                                   min_insync=args.min_insync)
            info = cluster.start(fresh=args.fresh, timeout_s=max(args.timeout_s, 180.0))
        except BrokerError as exc:
            print(f"trainguard dev kafka start: {str(exc).splitlines()[0]}")
            return 1
        print(json.dumps(_cluster_status(info)))
        return 0
    if cmd in ("stop", "kill"):
        stopped = cluster.stop() if cmd == "stop" else cluster.kill()
        print(json.dumps({"status": "stopped" if stopped else "not running"}))
        return 0
    if cmd == "acls":
        print("trainguard dev kafka acls: the cluster is not secured")
        return 1
    running = cluster.running()
    if running is None:
        print(json.dumps({"status": "not running", "state_dir": str(cluster.root)}))
        return 3
    if cmd == "env":
        for key, value in running.client_env(args.prefix or _default_prefix()).items():
            print(f"export {key}={shlex.quote(value)}")
        return 0
    print(json.dumps(_cluster_status(running)))
    return 0


def _cluster_status(info: ClusterInfo) -> dict[str, object]:
    return {"status": "running", "bootstrap": info.bootstrap, "brokers": len(info.nodes),
            "pids": [n.pid for n in info.nodes], "state_dir": info.state_dir,
            "version": info.version, "replication_factor": info.replication_factor,
            "min_insync_replicas": info.min_insync_replicas}
