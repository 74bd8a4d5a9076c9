"""Prometheus metrics of the decision service and the actuator (``--metrics-port``).

Their counters are named for the service that counts (``trainguard_decide_*``,
``trainguard_actuator_*``): the log's own totals, ``trainguard_commands_total`` and
``trainguard_command_outcomes_total``, are the metrics service's, so a sum over every target
never counts a command twice."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

COMMANDS = Counter("trainguard_decide_commands_issued_total",
                   "Commands issued by this decision service",
                   ["action", "tier"])
OUTCOMES = Counter("trainguard_actuator_outcomes_total", "Command outcomes this actuator wrote",
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
