"""The `trainguard` command. Each subcommand lives in its own module and registers itself here,
explicitly, in one list.

Failures are handled here, once for every subcommand: an expected one (a bad file or config, an
unreachable broker; see ``common.describe_failure``) is ONE line on stderr,
``trainguard <command>: <what>``, and exit 2; anything else is a bug: one line and exit 1, its
traceback only with ``--debug`` or ``TRAINGUARD_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import logging
import os
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
    importer,
    incident,
    keys,
    metrics,
    replay,
    score,
    streams,
    topics,
)
from trainguard.cli.common import (
    DEBUG_ENV,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    describe_failure,
    one_line,
)
from trainguard.cli.flags import version

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
    importer.register,
    incident.register,
    keys.register,
    metrics.register,
    replay.register,
    score.register,
    streams.register,
    topics.register,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainguard",
        description="Fault-tolerance control loop for long distributed training jobs.",
    )
    parser.add_argument("--version", action="version", version=f"trainguard {version()}",
                        help="print the installed version and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true",
                        help=f"show the traceback of an unexpected error (also ${DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in SUBCOMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    func: Callable[[argparse.Namespace], int] = args.func
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    try:
        return func(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        return _fail(exc.code, EXIT_USAGE)  # a command's own one-line refusal
    except Exception as exc:  # the one place every failure is reported
        if debug:
            raise
        known = describe_failure(exc, getattr(args, "kafka_bootstrap", None))
        if known is not None:
            return _fail(f"trainguard {_command(args)}: {known[0]}", known[1])
        return _fail(f"trainguard {_command(args)}: internal error: {type(exc).__name__}: "
                     f"{exc} (run with --debug or {DEBUG_ENV}=1 for the traceback)", EXIT_FAILED)


def _command(args: argparse.Namespace) -> str:
    """The subcommand's words, e.g. ``topics list``."""
    words = [args.command]
    for name, value in vars(args).items():
        if name.endswith("_command") and isinstance(value, str):
            words.append(value)
    return " ".join(words)


def _fail(message: str, code: int) -> int:
    print(one_line(message), file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
