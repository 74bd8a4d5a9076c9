"""The trainer-side step hook: ``StepReporter`` sends step reports and heartbeats to the node
agent over a Unix datagram socket (format: ``trainguard.sdk.wire``; socket path:
``trainguard.sdk.paths``). Light to import: no pydantic, no Kafka."""

from trainguard.sdk.paths import DEFAULT_SOCKET, ENV_SOCKET, default_socket_path
from trainguard.sdk.reporter import StepReporter

__all__ = ["DEFAULT_SOCKET", "ENV_SOCKET", "StepReporter", "default_socket_path"]
