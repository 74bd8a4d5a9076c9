"""Settings every subcommand shares: where Kafka is and which topic prefix to use."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable

from trainguard.bus.config import KafkaConfig
from trainguard.dev.cluster import KafkaCluster
from trainguard.dev.kafka import KafkaBroker


def add_kafka_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bootstrap", help="Kafka bootstrap servers (default: "
                        "$TRAINGUARD_KAFKA_BOOTSTRAP, else the dev broker if running)")
    parser.add_argument("--prefix", help="topic prefix (default: $TRAINGUARD_KAFKA_TOPIC_PREFIX "
                        "or 'tg')")


def kafka_config(args: argparse.Namespace, client_id: str = "trainguard") -> KafkaConfig:
    bootstrap = getattr(args, "bootstrap", None)
    if not bootstrap and not os.environ.get("TRAINGUARD_KAFKA_BOOTSTRAP"):
        cluster = KafkaCluster().running()
        if cluster is not None:  # the dev cluster: its nodes, and its replication
            env = {**cluster.client_env(), **os.environ}
            return KafkaConfig.from_env(env, topic_prefix=getattr(args, "prefix", None),
                                        client_id=client_id)
        dev = KafkaBroker().running()
        if dev is not None:
            bootstrap = dev.bootstrap
            if dev.secure and not os.environ.get("TRAINGUARD_KAFKA_SECURITY_PROTOCOL"):
                print(f"trainguard: the dev broker at {dev.bootstrap} is secured: connect as "
                      "a service with `eval $(trainguard dev kafka env SERVICE)`",
                      file=sys.stderr)
                raise SystemExit(2)
    return KafkaConfig.from_env(bootstrap=bootstrap, topic_prefix=getattr(args, "prefix", None),
                                client_id=client_id)


def run_until_stopped(run: Callable[[asyncio.Event], Awaitable[None]],
                      duration_s: float | None = None) -> None:
    """``run(stop)`` in a fresh event loop; SIGINT, SIGTERM or ``duration_s`` set ``stop``."""
    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if duration_s:
            loop.call_later(duration_s, stop.set)
        await run(stop)

    asyncio.run(main())
