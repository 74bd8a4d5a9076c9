"""`trainguard events schema|tail|validate`: the contract, and the log as it is."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from trainguard.bus.consumer import EventConsumer
from trainguard.bus.producer import EventProducer
from trainguard.cli.common import add_kafka_args, input_file, kafka_config
from trainguard.cli.flags import renamed
from trainguard.events.codec import decode, encode
from trainguard.events.docs import render_markdown
from trainguard.events.errors import ContractError
from trainguard.events.topics import EVENT_ROLES, TopicRole


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    events = sub.add_parser("events", help="the event contract and the event log")
    ev_sub = events.add_subparsers(dest="events_command", required=True)
    schema = ev_sub.add_parser("schema", help="print the contract (docs/events.md)")
    renamed(schema, schema.add_argument("--out", type=Path, help="write to this file instead "
                                        "of stdout"), "--output")
    schema.set_defaults(func=_schema)
    tail = ev_sub.add_parser("tail", help="print events from the log, one JSON per line")
    add_kafka_args(tail)
    tail.add_argument("--role", action="append", choices=[r.value for r in EVENT_ROLES],
                      help="topic roles to read (default: all)")
    tail.add_argument("--follow", action="store_true", help="keep reading new events")
    tail.set_defaults(func=_tail)
    validate = ev_sub.add_parser("validate", help="check a JSON-lines file of events")
    validate.add_argument("file", type=input_file, help="JSON-lines file, one event a line")
    validate.set_defaults(func=_validate)


def _schema(args: argparse.Namespace) -> int:
    text = render_markdown()
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


def _tail(args: argparse.Namespace) -> int:
    cfg = kafka_config(args, client_id="trainguard-tail")
    roles = [TopicRole(r) for r in args.role] if args.role else list(EVENT_ROLES)

    async def run() -> None:
        dlq = EventProducer(cfg)
        consumer = EventConsumer(cfg, roles, group_id=None, name="tail", dlq=dlq)
        try:
            await dlq.start()
            await consumer.start()
            while True:
                batch = await (consumer.poll(timeout_ms=1000) if args.follow
                               else consumer.drain(idle_ms=1000))
                for item in batch:
                    sys.stdout.write(encode(item.event).decode() + "\n")
                sys.stdout.flush()
                if not args.follow:
                    return
        finally:
            await consumer.stop()
            await dlq.stop()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass
    return 0


def _validate(args: argparse.Namespace) -> int:
    bad = 0
    with args.file.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                decode(line)
            except ContractError as err:
                bad += 1
                print(f"{args.file}:{lineno}: {err}", file=sys.stderr)
    print(f"{bad} invalid record(s)")
    return 1 if bad else 0
