"""Every PromQL expression of every dashboard returns data from a real Prometheus; the same
running metrics service exports one trace per ended incident over OTLP.

Real parts only: the session's Kafka broker, `trainguard metrics serve` and `trainguard agent`
as their own processes, Debian's prometheus scraping both every second. The event log is two
scripted fault episodes (trainguard/metrics/scenario.py) published to the broker, a malformed
record and the dead letter a real consumer writes for it, published in two waves so that rates
and histogram quantiles have increases to show.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import arun
from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import EventConsumer
from trainguard.bus.producer import EventProducer
from trainguard.dashboards.build import build_all
from trainguard.dashboards.queries import expressions, substitute
from trainguard.dev.kafka import free_port
from trainguard.dev.prometheus import PrometheusServer
from trainguard.events.clock import now_us
from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentState, IncidentTransition
from trainguard.events.topics import TopicNames, TopicRole
from trainguard.metrics.scenario import episode
from trainguard.traces.ids import trace_id_for
from trainguard.traces.otlp_receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parents[2]
JOB = "job-prom"
OURS = 'trainguard_events_total{type!="telemetry.node"}'  # the agent publishes telemetry
CLI = [sys.executable, "-m", "trainguard.cli.main"]


def _publish(kafka: KafkaConfig, events: list[Event]) -> None:
    """The events, one malformed record, and the dead letter a real consumer writes for it."""
    names = TopicNames(kafka.topic_prefix)

    async def go() -> None:
        async with EventProducer(kafka) as producer:
            for e in events:
                await producer.enqueue(e)
            await producer.flush()
            await producer.send_raw(names.name(TopicRole.TASK), b'{"type": "step.report"}',
                                    key=JOB.encode())
            consumer = EventConsumer(kafka, [TopicRole.TASK], group_id="dlq-writer",
                                     name="streams-probe", dlq=producer)
            await consumer.start()
            try:
                await consumer.drain(idle_ms=500, limit_s=20)
                await consumer.commit()
            finally:
                await consumer.stop()

    arun(go(), timeout_s=60)


def _publish_only(kafka: KafkaConfig, events: list[Event]) -> None:
    async def go() -> None:
        async with EventProducer(kafka) as producer:
            for e in events:
                await producer.send(e)

    arun(go(), timeout_s=30)


def _spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        return subprocess.Popen([*CLI, *args], stdout=fh, stderr=subprocess.STDOUT)


@pytest.fixture
def services(kafka: KafkaConfig, tmp_path: Path
             ) -> Iterator[tuple[PrometheusServer, OtlpReceiver, Path]]:
    metrics_port, agent_port = free_port(), free_port()
    kargs = ["--bootstrap", kafka.bootstrap, "--prefix", kafka.topic_prefix]
    rx = OtlpReceiver().__enter__()
    procs = [
        _spawn(["metrics", "serve", *kargs, "--port", str(metrics_port), "--from", "earliest",
                "--otlp-endpoint", rx.endpoint, "--watch-group", "dlq-writer"],
               tmp_path / "metrics.log"),
        _spawn(["agent", "--node", "node-prom", *kargs, "--interval", "0.25", "--metrics-port",
                str(agent_port), "--no-kernel-log", "--gpu", "none", "--spool-dir",
                str(tmp_path / "spool"), "--socket", str(tmp_path / "agent.sock")],
               tmp_path / "agent.log"),
    ]
    prom = PrometheusServer(root=tmp_path / "prometheus")
    prom.root.mkdir()  # type: ignore[union-attr]
    try:
        prom.start({"trainguard-metrics": [f"127.0.0.1:{metrics_port}"],
                    "trainguard-agent": [f"127.0.0.1:{agent_port}"]}, interval="1s",
                   rule_files=sorted((ROOT / "deploy/prometheus/rules").glob("*.yml")))
        yield prom, rx, tmp_path
    finally:
        prom.stop()
        rx.__exit__()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _wait(what: str, check: Any, timeout_s: float, logs: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    tails = {p.name: p.read_text(errors="replace")[-1500:] for p in logs.glob("*.log")}
    pytest.fail(f"timed out waiting for {what}; logs: {tails}")


def _value(prom: PrometheusServer, expr: str) -> float:
    result = prom.query(expr)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


def test_every_dashboard_query_returns_data_from_real_prometheus(
        kafka: KafkaConfig, services: tuple[PrometheusServer, OtlpReceiver, Path]) -> None:
    prom, rx, logs = services
    _wait("both targets up", lambda: len(prom.targets_up()) == 2
          and all(prom.targets_up().values()), 40, logs)
    t0 = now_us() - 14_000_000
    first = episode(JOB, t0, "a")
    _publish(kafka, first)
    _wait("the first wave scraped",
          lambda: prom.query("sum(trainguard_dlq_records_total) >= 1"), 40, logs)
    second = episode(JOB, t0 + 1_000_000, "b", leave_open=True)
    _publish(kafka, second)
    total = len(first) + len(second)
    _wait("the second wave scraped",
          lambda: prom.query(f"sum({OURS}) >= {total}"), 40, logs)

    # the values are the log's, not just present
    assert _value(prom, f"sum({OURS})") == total
    assert _value(prom, "sum(trainguard_dlq_records_total)") == 2
    assert _value(prom, "sum(trainguard_invalid_records_total)") == 2
    assert _value(prom, "trainguard_incidents_open") == 1
    assert _value(prom, "sum(trainguard_incident_recovery_seconds_count)") == 4
    recovered_at = max(e.event_time for e in second if e.type == "incident.transition"
                       and getattr(e.payload, "to_state", None) == "recovered")
    assert _value(prom, 'trainguard_incident_last_transition_timestamp_seconds{state="recovered"}'
                  ) == recovered_at / 1e6
    loaded = {g["name"] for g in prom.api("rules")["groups"]}
    assert {"trainguard-pipeline", "trainguard-incidents", "trainguard-agents"} <= loaded

    # the group that wrote the dead letters has committed to the end of the task topic ...
    lag = 'trainguard_consumer_group_lag_records{group="dlq-writer", topic="task"}'
    _wait("the watched group's lag", lambda: prom.query(f"{lag} == 0"), 20, logs)
    _publish_only(kafka, episode("job-late", now_us(), "late", steps=2)[:5])
    # ... and is 5 records behind once 5 more arrive there
    _wait("the watched group's lag to grow", lambda: prom.query(f"{lag} == 5"), 20, logs)

    empty: list[str] = []
    checked = 0
    for name, doc in build_all().items():
        for q in expressions(doc):
            expr = substitute(q.expr, {"job": JOB})
            result = prom.query(expr)
            values = [float(r["value"][1]) for r in result]
            checked += 1
            if not values or all(math.isnan(v) for v in values):
                empty.append(f"{name} {q.where}: {expr} -> {result}")
    assert checked >= 40
    assert not empty, "queries without data:\n" + "\n".join(empty)

    ended = {e.payload.incident_id for e in first + second
             if isinstance(e.payload, IncidentTransition)
             and e.payload.to_state in (IncidentState.RECOVERED, IncidentState.ESCALATED)}
    assert len(ended) == 6
    want = {trace_id_for(i) for i in ended}
    names = {"incident", "detect", "locate", "action migrate", "recover", "escalate"}
    # a batch exporter may send one trace's spans in two exports: wait for the spans too
    _wait("one trace per ended incident over OTLP, all its spans",
          lambda: {s.trace_id for s in rx.spans()} >= want
          and {s.name for s in rx.spans()} >= names, 30, logs)
    got = rx.spans()
    assert {s.trace_id for s in got} == want  # the open incident has no trace yet
    assert {s.name for s in got} >= names
