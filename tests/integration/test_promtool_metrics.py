"""Every exposition trainguard serves passes Prometheus' own linter, ``promtool check metrics``
(Debian's prometheus package): base units, counter suffixes, help text, naming."""

from __future__ import annotations

import subprocess

import pytest
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

from trainguard.agent.metrics import AgentMetrics
from trainguard.alerts.metrics import AlertMetrics
from trainguard.dev.prometheus import find_binary
from trainguard.events.payloads import ProcessSample, ProcessState, StepReport
from trainguard.metrics.recorder import Recorder
from trainguard.metrics.registry import PipelineMetrics
from trainguard.rules.synth import step_report, telemetry

pytestmark = pytest.mark.integration


def _pipeline() -> CollectorRegistry:
    m = PipelineMetrics()
    rec = Recorder(m)
    rec.observe(step_report("job-1", 0, 5, 1_000_000, 12.5), "task")
    rec.observe(telemetry("job-1", "node-a", 1_000_000, 1, processes=[
        ProcessSample(pid=10, rank=0, job_id="job-1", gpu=0, state=ProcessState.RUNNING)]),
        "telemetry")
    assert isinstance(step_report("job-1", 0, 5, 1, 1.0).payload, StepReport)
    return m.registry


def _services() -> CollectorRegistry:
    from trainguard.actuators import metrics

    metrics.COMMANDS.labels("migrate", "2").inc()
    metrics.OUTCOMES.labels("migrate", "done").inc()
    metrics.PHASE.labels("fence").observe(0.2)
    return REGISTRY


def _alerts() -> CollectorRegistry:
    m = AlertMetrics()
    m.sent.labels("slack", "opened").inc()
    return m.registry


def _agent() -> CollectorRegistry:
    m = AgentMetrics()
    m.published.labels("telemetry.node").inc()
    m.publish_latency.observe(0.01)
    return m.registry


@pytest.mark.parametrize("build", [_pipeline, _services, _alerts, _agent],
                         ids=["metrics-serve", "decide-actuator", "alerts", "agent"])
def test_exposition_passes_promtool(build: object) -> None:
    assert callable(build)
    text = generate_latest(build())
    done = subprocess.run([find_binary("promtool"), "check", "metrics"], input=text,
                          capture_output=True, timeout=30)
    problems = (done.stdout + done.stderr).decode()
    assert done.returncode == 0 and not problems.strip(), problems


def test_promtool_does_fail_on_a_bad_exposition() -> None:
    bad = b"# HELP x_ms a gauge in ms\n# TYPE x_ms gauge\nx_ms 1\n"
    done = subprocess.run([find_binary("promtool"), "check", "metrics"], input=bad,
                          capture_output=True, timeout=30)
    assert done.returncode != 0 and b"abbreviated units" in done.stdout + done.stderr
