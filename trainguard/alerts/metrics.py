"""The alerts service's own metrics (prometheus-client, its own registry)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge


@dataclass
class AlertMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.sent = Counter("trainguard_alerts_messages_sent_total",
                            "Messages a channel accepted", ["channel", "kind"], registry=r)
        self.failed = Counter("trainguard_alerts_messages_failed_total",
                              "Messages given up on (refused, or retries exhausted)",
                              ["channel", "kind"], registry=r)
        self.attempts = Counter("trainguard_alerts_attempts_total",
                                "HTTP attempts by result (delivered, retry, refused)",
                                ["channel", "result"], registry=r)
        self.transitions = Counter("trainguard_alerts_transitions_total",
                                   "Incident transitions read", registry=r)
        self.notices = Counter("trainguard_alerts_notices_total",
                               "Notices announced, by kind", ["kind"], registry=r)
        self.queued = Gauge("trainguard_alerts_queued_batches",
                            "Batches waiting for a channel", ["channel"], registry=r)
        self.incidents = Gauge("trainguard_alerts_known_incidents",
                               "Incidents the coalescer holds", registry=r)
