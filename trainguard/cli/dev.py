"""`trainguard dev kafka start|stop|status|kill`: the local real broker."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trainguard.dev.kafka import KafkaBroker, fetch_kafka


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
