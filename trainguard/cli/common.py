"""Settings every subcommand shares: where Kafka is and which topic prefix to use; the
arguments that name files a command reads; and the expected failures, each turned into ONE line
on stderr and an exit code (``main`` does that for every subcommand, in one place)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

from trainguard.bus.config import KafkaConfig
from trainguard.dev.cluster import KafkaCluster
from trainguard.dev.kafka import KafkaBroker

EXIT_FAILED = 1  # an unexpected error (its traceback with --debug or TRAINGUARD_DEBUG=1)
EXIT_USAGE = 2  # bad input (a file, a config, an argument) or a service that cannot be reached
EXIT_INTERRUPTED = 130
DEBUG_ENV = "TRAINGUARD_DEBUG"
MAX_MESSAGE = 600  # characters of one error line


class CliError(Exception):
    """An expected failure a command reports as ``trainguard <command>: <message>``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def input_file(text: str) -> Path:
    """The argparse ``type`` of an argument naming a file the command reads. Reading it is left
    to the command's loader (whose errors name the field); the CLI test walks every argument of
    this type with a missing file, a directory and a malformed file."""
    return Path(text)


def check_ids(*, job_id: str | None = None, node: str | None = None) -> None:
    """Command-line ids that travel in events, checked by the contract's own validators."""
    from pydantic import TypeAdapter, ValidationError

    from trainguard.configfile import show
    from trainguard.events.envelope import JobId, Subject

    def check(what: str, value: str) -> None:
        if what == "node":
            Subject(node=value)
        else:
            TypeAdapter(JobId).validate_python(value)

    for what, value in (("job id", job_id), ("node", node)):
        if value is None:
            continue
        try:
            check(what, value)
        except ValidationError as exc:
            raise CliError(f"{what} {show(value)} breaks the event contract: "
                           f"{exc.errors()[0]['msg']}") from None


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
            cluster_cfg = KafkaConfig.from_env(env, topic_prefix=getattr(args, "prefix", None),
                                               client_id=client_id)
            args.kafka_bootstrap = cluster_cfg.bootstrap
            return cluster_cfg
        dev = KafkaBroker().running()
        if dev is not None:
            bootstrap = dev.bootstrap
            if dev.secure and not os.environ.get("TRAINGUARD_KAFKA_SECURITY_PROTOCOL"):
                raise CliError(f"the dev broker at {dev.bootstrap} is secured: connect as a "
                               "service with `eval $(trainguard dev kafka env SERVICE)`")
    cfg = KafkaConfig.from_env(bootstrap=bootstrap, topic_prefix=getattr(args, "prefix", None),
                               client_id=client_id)
    check_bootstrap(cfg.bootstrap)
    args.kafka_bootstrap = cfg.bootstrap  # named by the error line if Kafka cannot be reached
    return cfg


def check_bootstrap(bootstrap: str) -> None:
    """``host[:port],...`` with every port a number from 1 to 65535."""
    for server in bootstrap.split(","):
        host, sep, port = server.strip().rpartition(":")
        if not sep:
            host, port = port, "9092"
        if not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
            raise CliError(f"Kafka bootstrap {bootstrap!r}: {server.strip()!r} is not "
                           "host:port (port 1-65535)")


def _expected_errors() -> tuple[type[BaseException], ...]:
    """The error types that mean bad input or an unreachable service, not a bug. Imported when
    a command has failed, so that start-up stays fast."""
    from trainguard.actuators.jobspec import JobSpecError
    from trainguard.actuators.signing import SigningKeyError
    from trainguard.alerts.config import ConfigError
    from trainguard.bus.config import KafkaConfigError
    from trainguard.configfile import ConfigFileError
    from trainguard.dev.kafka import BrokerError
    from trainguard.drills.scenario import ScenarioError
    from trainguard.events.errors import ContractError
    from trainguard.incidents.query import IncidentNotFound
    from trainguard.incidents.source import LogFileError, LogSourceError
    from trainguard.incidents.state_codec import SnapshotError
    from trainguard.replay.window import WindowError
    from trainguard.rules.schema import RuleError
    from trainguard.traces.provider import OtlpConfigError

    return (CliError, ConfigFileError, RuleError, JobSpecError, ConfigError, ScenarioError,
            KafkaConfigError, SigningKeyError, LogFileError, LogSourceError, WindowError,
            IncidentNotFound, ContractError, BrokerError, OtlpConfigError, SnapshotError,
            UnicodeError)


def one_line(text: str) -> str:
    """``text`` as one line (a multi-problem message's lines joined by '; '), cut to size."""
    line = "; ".join(" ".join(part.split()) for part in text.splitlines() if part.strip())
    return line if len(line) <= MAX_MESSAGE else line[:MAX_MESSAGE - 3] + "..."


def describe_failure(exc: BaseException, bootstrap: str | None) -> tuple[str, int] | None:
    """The one-line message and exit code of an expected failure; None for a bug."""
    from aiokafka.errors import KafkaConnectionError, KafkaError

    where = bootstrap or "the configured bootstrap"
    if isinstance(exc, KafkaConnectionError):
        return one_line(f"cannot reach Kafka at {where} (is the broker up?): {exc}"), EXIT_USAGE
    if isinstance(exc, KafkaError):
        return one_line(f"Kafka at {where}: {exc}"), EXIT_USAGE
    if isinstance(exc, OSError):
        what = f"{exc.filename}: " if exc.filename else ""
        return one_line(f"{what}{exc.strerror or exc}"), EXIT_USAGE
    if isinstance(exc, _expected_errors()):
        code = exc.code if isinstance(exc, CliError) else EXIT_USAGE
        return one_line(str(exc) or type(exc).__name__), code
    return None


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
