"""Events -> metrics: what each event type does to the exported series."""

from __future__ import annotations

from trainguard.bus.dlq import DeadLetter
from trainguard.events.envelope import Event
from trainguard.events.topics import TopicNames
from trainguard.metrics.recorder import Recorder
from trainguard.metrics.registry import PipelineMetrics
from trainguard.metrics.scenario import INGEST_DELAY_US, episode

T0 = 1_790_000_000_000_000
ROLE = {"step.report": "task", "checkpoint": "task", "process.exit": "task",
        "verdict": "verdicts", "command": "commands", "command.outcome": "outcomes",
        "incident.transition": "incidents"}


def _fed(events: list[Event], series_ttl_s: float = 3600.0) -> Recorder:
    rec = Recorder(PipelineMetrics(), series_ttl_s=series_ttl_s)
    for e in events:
        rec.observe(e, ROLE[e.type])
    return rec


def _v(rec: Recorder, name: str, **labels: str) -> float | None:
    return rec.metrics.registry.get_sample_value(name, labels)


def test_counts_by_type_kind_action_status_and_state() -> None:
    rec = _fed(episode("job-1", T0, leave_open=True))
    assert _v(rec, "trainguard_events_total", type="step.report", topic="task") == 48
    assert _v(rec, "trainguard_verdicts_total", kind="straggler", state="open",
              severity="warning") == 2
    assert _v(rec, "trainguard_verdicts_total", kind="process_exit", state="resolved",
              severity="critical") == 1
    assert _v(rec, "trainguard_commands_total", action="migrate", tier="2") == 1
    assert _v(rec, "trainguard_command_outcomes_total", action="migrate", status="failed") == 1
    assert _v(rec, "trainguard_incident_transitions_total", state="detected") == 4
    assert _v(rec, "trainguard_incident_transitions_total", state="recovered") == 2
    assert _v(rec, "trainguard_incident_transitions_total", state="escalated") == 1
    assert _v(rec, "trainguard_commands_total", action="escalate", tier="0") == 1


def test_a_redelivered_event_is_counted_once() -> None:
    events = episode("job-1", T0)
    rec = _fed(events + events[:10])
    assert _v(rec, "trainguard_events_total", type="step.report", topic="task") == 48


def test_recovery_durations_come_from_transition_event_times() -> None:
    rec = _fed(episode("job-1", T0, leave_open=True))
    assert _v(rec, "trainguard_incident_recovery_seconds_count") == 2
    # straggler incident: detected at t0+5s, recovered at t0+9s; process exit: 9s -> 11s
    assert _v(rec, "trainguard_incident_recovery_seconds_sum") == 4.0 + 2.0
    assert _v(rec, "trainguard_incident_recovery_seconds_bucket", le="2.5") == 1
    assert _v(rec, "trainguard_incidents_open") == 1
    assert _v(rec, "trainguard_incident_oldest_open_detected_timestamp_seconds") == (
        T0 + 10_000_000) / 1e6


def test_ingest_lag_is_ingest_minus_event_time() -> None:
    rec = _fed(episode("job-1", T0))
    count = _v(rec, "trainguard_event_ingest_lag_seconds_count", topic="task")
    total = _v(rec, "trainguard_event_ingest_lag_seconds_sum", topic="task")
    assert count and total is not None
    assert abs(total / count - INGEST_DELAY_US / 1e6) < 1e-9


def test_step_time_last_step_checkpoint_and_annotation_times() -> None:
    rec = _fed(episode("job-1", T0))
    assert _v(rec, "trainguard_step_compute_seconds", job_id="job-1", rank="3") == 0.103
    assert _v(rec, "trainguard_job_last_step", job_id="job-1") == 11
    assert _v(rec, "trainguard_checkpoint_last_step", job_id="job-1", action="verified") == 3
    assert _v(rec, "trainguard_checkpoint_last_timestamp_seconds", job_id="job-1",
              action="written") == (T0 + 3_500_000) / 1e6
    assert _v(rec, "trainguard_incident_last_transition_timestamp_seconds", job_id="job-1",
              state="recovered") == (T0 + 11_000_000) / 1e6


def test_straggler_ratio_follows_open_verdicts_and_goes_when_resolved() -> None:
    rec = _fed(episode("job-1", T0, leave_open=True))
    assert _v(rec, "trainguard_straggler_ratio", job_id="job-1", rank="2") is None  # resolved
    assert _v(rec, "trainguard_straggler_ratio", job_id="job-1", rank="1") == 2.5  # still open


def test_silent_jobs_series_expire_by_event_time() -> None:
    rec = _fed(episode("job-old", T0) + episode("job-new", T0 + 7200 * 1_000_000),
               series_ttl_s=3600)
    removed = rec.sweep(T0 + 7200 * 1_000_000 + 20_000_000)
    assert removed > 0
    assert _v(rec, "trainguard_step_compute_seconds", job_id="job-old", rank="0") is None
    assert _v(rec, "trainguard_job_last_step", job_id="job-old") is None
    assert _v(rec, "trainguard_step_compute_seconds", job_id="job-new", rank="0") == 0.1
    # counters are not job-keyed and stay
    assert _v(rec, "trainguard_events_total", type="step.report", topic="task") == 96


def test_dead_letters_by_source_role_and_consumer_invalid_by_topic() -> None:
    rec = Recorder(PipelineMetrics())
    names = TopicNames("tgx")
    letter = DeadLetter(reason="payload.compute_ms: bad", field="payload.compute_ms",
                        value="-1", source_topic="tgx.task", source_partition=0,
                        source_offset=7, key_b64=None, value_b64="", rejected_at=T0,
                        consumer="streams")
    rec.dead_letter(letter, names)
    rec.dead_letter(letter, names)
    rec.dead_letter(DeadLetter(**{**letter.__dict__, "source_topic": "elsewhere"}), names)
    rec.invalid("task")
    assert _v(rec, "trainguard_dlq_records_total", source_topic="task", consumer="streams") == 2
    assert _v(rec, "trainguard_dlq_records_total", source_topic="other",
              consumer="streams") == 1
    assert _v(rec, "trainguard_invalid_records_total", topic="task") == 1


def test_rank_info_joins_node_and_gpu_to_job_and_rank() -> None:
    from trainguard.events.payloads import ProcessSample, ProcessState
    from trainguard.rules.synth import telemetry

    def procs(state: ProcessState) -> list[ProcessSample]:
        return [ProcessSample(pid=10, rank=3, job_id="job-1", gpu=2, state=state),
                ProcessSample(pid=11, rank=4, job_id="job-1", state=state)]  # GPU unknown

    rec = Recorder(PipelineMetrics())
    rec.observe(telemetry("job-1", "node-a", T0, 1, processes=procs(ProcessState.RUNNING)),
                "telemetry")
    assert _v(rec, "trainguard_rank_info", job_id="job-1", rank="3", node="node-a",
              gpu="2") == 1
    assert not [s for f in rec.metrics.registry.collect() for s in f.samples
                if s.name == "trainguard_rank_info" and s.labels["rank"] == "4"]
    rec.observe(telemetry("job-1", "node-a", T0 + 1, 2, processes=procs(ProcessState.EXITED)),
                "telemetry")
    assert _v(rec, "trainguard_rank_info", job_id="job-1", rank="3", node="node-a",
              gpu="2") is None
