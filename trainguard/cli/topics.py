"""`trainguard topics create|list`: the registry's topics on a broker."""

from __future__ import annotations

import argparse
import asyncio
import json

from trainguard.bus.admin import ensure_topics, topic_configs
from trainguard.cli.common import add_kafka_args, kafka_config
from trainguard.events.topics import TOPIC_SPECS, TopicNames


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    topics = sub.add_parser("topics", help="the event log's topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True)
    create = topics_sub.add_parser("create", help="create every registered topic that is missing")
    add_kafka_args(create)
    create.add_argument("--partitions", type=int,
                        help="one partition count for every topic (small local brokers)")
    create.set_defaults(func=_create)
    show = topics_sub.add_parser("list", help="print the registry, and the broker's configs")
    add_kafka_args(show)
    show.add_argument("--offline", action="store_true", help="the registry only, no broker")
    show.set_defaults(func=_list)


def _create(args: argparse.Namespace) -> int:
    cfg = kafka_config(args)
    overrides = {s.role: args.partitions for s in TOPIC_SPECS} if args.partitions else None
    states = asyncio.run(ensure_topics(cfg, partitions=overrides))
    for st in states:
        print(json.dumps({"topic": st.name, "partitions": st.partitions, "created": st.created}))
    return 0


def _list(args: argparse.Namespace) -> int:
    cfg = kafka_config(args)
    names = TopicNames(cfg.topic_prefix)
    for spec in TOPIC_SPECS:
        row: dict[str, object] = {"topic": names.name(spec.role), "partitions": spec.partitions,
                                  "key": spec.key, **spec.configs()}
        if not args.offline:
            live = asyncio.run(topic_configs(cfg, names.name(spec.role)))
            row["broker"] = {k: live.get(k) for k in ("retention.ms", "cleanup.policy")}
        print(json.dumps(row))
    return 0
