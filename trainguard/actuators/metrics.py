"""Prometheus metrics of the decision service and the actuator (``--metrics-port``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

COMMANDS = Counter("trainguard_commands_total", "Commands issued by the decision service",
                   ["action", "tier"])
OUTCOMES = Counter("trainguard_command_outcomes_total", "Command outcomes from the actuator",
                   ["action", "status"])
REFUSED_REPLICAS = Counter("trainguard_replicas_refused_total",
                           "Stale replicas refused (old binding epoch)", ["action"])
PHASE = Histogram("trainguard_recovery_phase_seconds",
                  "Recovery phase durations: decide (verdict -> command), fence, bind, command "
                  "(accepted -> done)", ["phase"],
                  buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120))


def serve(port: int, addr: str = "127.0.0.1") -> None:
    if port:
        from prometheus_client import start_http_server

        start_http_server(port, addr=addr)
