"""The trainer-side step hook: ``StepReporter`` sends step reports and heartbeats to the node
agent over a Unix datagram socket (format: ``trainguard_sdk.wire``; socket path:
``trainguard_sdk.paths``). Light to import: no pydantic, no Kafka."""

from trainguard_sdk.paths import DEFAULT_SOCKET, ENV_SOCKET, default_socket_path
from trainguard_sdk.reporter import StepReporter

__all__ = ["DEFAULT_SOCKET", "ENV_SOCKET", "StepReporter", "default_socket_path"]
