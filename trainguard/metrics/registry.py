"""Every metric the pipeline-metrics service exports, with bounded label sets.

Labels and their bounds (see docs/observability.md):
- ``type``: the registry's event types (13); ``topic``: topic roles (8), never full names;
- ``group``: the consumer groups named with ``--watch-group-id``;
- ``kind``: rule kinds of the rule set; ``state``, ``severity``, ``action``, ``status``,
  ``tier``: the contract's enums;
- ``job_id`` (not ``job``: Prometheus names the scrape job so) and ``rank``: live jobs and their
  ranks only. Series keyed by job are removed once the job has been silent (in event time) for
  ``series_ttl_s`` (``expiry.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
RECOVERY_BUCKETS = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)


@dataclass
class PipelineMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.events = Counter("trainguard_events_total", "Valid events read, by type and topic",
                              ["type", "topic"], registry=r)
        self.invalid = Counter("trainguard_invalid_records_total",
                               "Records that failed validation here (dead-lettered by their "
                               "own consumers, only counted here)", ["topic"], registry=r)
        self.verdicts = Counter("trainguard_verdicts_total", "Verdicts by kind, state, severity",
                                ["kind", "state", "severity"], registry=r)
        self.commands = Counter("trainguard_commands_total", "Remediation commands",
                                ["action", "tier"], registry=r)
        self.outcomes = Counter("trainguard_command_outcomes_total", "Command outcomes",
                                ["action", "status"], registry=r)
        self.transitions = Counter("trainguard_incident_transitions_total",
                                   "Incident transitions, by the state entered", ["state"],
                                   registry=r)
        self.transition_time = Gauge(
            "trainguard_incident_last_transition_timestamp_seconds",
            "Event time of the job's latest incident transition into this state (annotations)",
            ["job_id", "state"], registry=r)
        self.incidents_open = Gauge("trainguard_incidents_open",
                                    "Incidents seen detected and not yet in an end state",
                                    registry=r)
        self.nodes_external_fault = Gauge(
            "trainguard_nodes_external_fault",
            "Nodes with at least one open external_fault verdict (fault feeds)", registry=r)
        self.oldest_open = Gauge(
            "trainguard_incident_oldest_open_detected_timestamp_seconds",
            "Event time the oldest open incident was detected (0: none open)", registry=r)
        self.recovery = Histogram("trainguard_incident_recovery_seconds",
                                  "Incident detected -> recovered, in event time",
                                  buckets=RECOVERY_BUCKETS, registry=r)
        self.ingest_lag = Histogram("trainguard_event_ingest_lag_seconds",
                                    "ingest_time - event_time of each event", ["topic"],
                                    buckets=LAG_BUCKETS, registry=r)
        self.consumer_lag = Gauge("trainguard_consumer_lag_records",
                                  "Records on the topic not yet read by this service", ["topic"],
                                  registry=r)
        self.group_lag = Gauge("trainguard_consumer_group_lag_records",
                               "Records the watched consumer group has not committed yet",
                               ["group", "topic"], registry=r)
        self.dlq = Counter("trainguard_dlq_records_total",
                           "Dead letters, by the topic they were refused from and by whom",
                           ["source_topic", "consumer"], registry=r)
        self.step_compute = Gauge("trainguard_step_compute_seconds",
                                  "Latest step compute time per job and rank",
                                  ["job_id", "rank"], registry=r)
        self.rank_info = Gauge(
            "trainguard_rank_info",
            "1 for each rank process seen on a node's GPU: joins node/GPU metrics (dcgm-exporter "
            "relabelled Hostname -> node) to job and rank with group_left",
            ["job_id", "rank", "node", "gpu"], registry=r)
        self.last_step = Gauge("trainguard_job_last_step",
                               "Step of the job's latest step report (by event time)",
                               ["job_id"], registry=r)
        self.straggler_ratio = Gauge(
            "trainguard_straggler_ratio",
            "Evidence 'ratio' of the latest open straggler verdict on the rank (removed when "
            "resolved)", ["job_id", "rank"], registry=r)
        self.checkpoint_step = Gauge("trainguard_checkpoint_last_step",
                                     "Step of the job's latest checkpoint event, by action",
                                     ["job_id", "action"], registry=r)
        self.checkpoint_time = Gauge("trainguard_checkpoint_last_timestamp_seconds",
                                     "Event time of the job's latest checkpoint event, by action",
                                     ["job_id", "action"], registry=r)
