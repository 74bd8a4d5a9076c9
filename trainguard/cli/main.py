"""The `trainguard` command. Each subcommand lives in its own module and registers itself here,
explicitly, in one list."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from trainguard.cli import (
    actuator,
    agent,
    alerts,
    dashboards,
    decide,
    demo,
    dev,
    drill,
    events,
    incident,
    keys,
    metrics,
    replay,
    streams,
    topics,
)

Register = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]
SUBCOMMANDS: tuple[Register, ...] = (
    actuator.register,
    agent.register,
    alerts.register,
    dashboards.register,
    decide.register,
    demo.register,
    dev.register,
    drill.register,
    events.register,
    incident.register,
    keys.register,
    metrics.register,
    replay.register,
    streams.register,
    topics.register,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainguard",
        description="Fault-tolerance control loop for long distributed training jobs.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in SUBCOMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
