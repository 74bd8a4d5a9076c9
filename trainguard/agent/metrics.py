"""The agent's own health on /metrics (prometheus-client, its own registry)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


@dataclass
class AgentMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.published = Counter("trainguard_agent_records_published_total",
                                 "Records acknowledged by Kafka", ["type"], registry=r)
        self.publish_latency = Histogram(
            "trainguard_agent_publish_latency_seconds",
            "From entering the spool to the broker's acknowledgement", registry=r,
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))
        self.spool_depth = Gauge("trainguard_agent_spool_depth_records",
                                 "Records waiting in the spool", registry=r)
        self.spool_bytes = Gauge("trainguard_agent_spool_bytes", "Bytes waiting in the spool",
                                 registry=r)
        self.dropped = Counter("trainguard_agent_records_dropped_total",
                               "Records dropped (spool budget, socket drops)",
                               ["type", "reason"], registry=r)
        self.malformed = Counter("trainguard_agent_malformed_input_total",
                                 "Bad input from a collector's source, by kind", ["kind"],
                                 registry=r)
        self.spool_corrupt = Counter("trainguard_agent_spool_corrupt_entries_total",
                                     "Damaged spool journal entries skipped at open", registry=r)
        self.broker_up = Gauge("trainguard_agent_broker_up",
                               "1 while the last publish attempt reached Kafka", registry=r)
        self.collect_seconds = Histogram("trainguard_agent_collect_seconds",
                                         "Time to run all collectors once", registry=r)
