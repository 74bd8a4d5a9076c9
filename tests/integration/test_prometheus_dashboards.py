"""Every PromQL expression of every dashboard returns data from a real Prometheus; the same
running metrics service exports one trace per ended incident over OTLP.

Real parts only: the session's Kafka broker, `trainguard metrics serve` and `trainguard agent`
as their own processes, Debian's prometheus scraping both every second. The event log is two
scripted fault episodes (trainguard/metrics/scenario.py) published to the broker, a malformed
record and the dead letter a real consumer writes for it, published in two waves so that rates
and histogram quantiles have increases to show.

GPU series come from dcgm-exporter-format endpoints serving the real captured scrapes in
../shared/data/dcgm (one endpoint per captured node, as one exporter per node), scraped with the
deployed config's relabelling (Hostname -> node). The captures hold no XID or NVLink series, so
one more endpoint serves those two, written here for the H100 node (the only synthetic series).
The job's rank processes on those nodes' GPUs come from agent telemetry published to the log.
"""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import arun
from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import EventConsumer
from trainguard.bus.producer import EventProducer
from trainguard.dashboards.build import build_all
from trainguard.dashboards.queries import expressions, substitute
from trainguard.dev.http_server import BackgroundHTTPServer
from trainguard.dev.kafka import free_port
from trainguard.dev.prometheus import PrometheusServer, deployed_job
from trainguard.events.clock import now_us
from trainguard.events.envelope import Event
from trainguard.events.payloads import (
    IncidentState,
    IncidentTransition,
    ProcessSample,
    ProcessState,
)
from trainguard.events.topics import TopicNames, TopicRole
from trainguard.metrics.scenario import episode
from trainguard.rules.synth import telemetry
from trainguard.traces.ids import trace_id_for
from trainguard.traces.otlp_receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parents[2]
DCGM = ROOT.parent / "shared" / "data" / "dcgm"
JOB = "job-prom"
VALUES = {"job": JOB, "node": ".*", "rank": ".*"}
# Where the job's ranks run: the captured nodes and their GPUs.
PLACEMENT = [("gpu-node-1", g) for g in range(8)] + [
    ("cp-bm14r7", 0), ("gpu1-wl8sg", 0), ("i-030791dc5a37cd257", 0)]
SYNTHETIC = "".join(
    f'DCGM_FI_DEV_XID_ERRORS{{gpu="{g}",Hostname="gpu-node-1"}} {79 if g == 3 else 0}\n'
    f'DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{gpu="{g}",Hostname="gpu-node-1"}} {1000 * g}\n'
    for g in range(8))
SYNTHETIC = ("# TYPE DCGM_FI_DEV_XID_ERRORS gauge\n# TYPE DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL "
             "counter\n" + SYNTHETIC)


def _scrape_server(body: bytes) -> BackgroundHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = BackgroundHTTPServer(Handler, name="dcgm-exporter")
    server.start()
    return server


def _ranks_on_gpus() -> list[Event]:
    """Agent telemetry of the job's rank processes on the captured nodes' GPUs."""
    by_node: dict[str, list[ProcessSample]] = {}
    for rank, (node, gpu) in enumerate(PLACEMENT):
        by_node.setdefault(node, []).append(ProcessSample(
            pid=1000 + rank, rank=rank, job_id=JOB, gpu=gpu, state=ProcessState.RUNNING))
    return [telemetry(JOB, node, now_us(), seq, processes=procs)
            for seq, (node, procs) in enumerate(sorted(by_node.items()))]
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
        _spawn(["metrics", "serve", *kargs, "--metrics-port", str(metrics_port),
                "--from-offset", "earliest", "--otlp-endpoint", rx.endpoint,
                "--watch-group-id", "dlq-writer"],
               tmp_path / "metrics.log"),
        _spawn(["agent", "--node", "node-prom", *kargs, "--interval-s", "0.25", "--metrics-port",
                str(agent_port), "--no-kernel-log", "--gpu", "none", "--spool-dir",
                str(tmp_path / "spool"), "--socket", str(tmp_path / "agent.sock")],
               tmp_path / "agent.log"),
    ]
    captured = sorted(DCGM.glob("*.prom"))
    assert len(captured) == 4, f"the captured dcgm-exporter scrapes are missing: {DCGM}"
    exporters = [_scrape_server(p.read_bytes()) for p in captured]
    exporters.append(_scrape_server(SYNTHETIC.encode()))
    prom = PrometheusServer(root=tmp_path / "prometheus")
    prom.root.mkdir()  # type: ignore[union-attr]
    try:
        prom.start({"trainguard-metrics": [f"127.0.0.1:{metrics_port}"],
                    "trainguard-agent": [f"127.0.0.1:{agent_port}"],
                    "dcgm-exporter": [e.base_url.removeprefix("http://") for e in exporters]},
                   interval="1s",
                   rule_files=sorted((ROOT / "deploy/prometheus/rules").glob("*.yml")),
                   job_settings={"dcgm-exporter": deployed_job(
                       ROOT / "deploy/prometheus/prometheus.yml", "dcgm-exporter")})
        yield prom, rx, tmp_path
    finally:
        prom.stop()
        for e in exporters:
            e.stop()
        rx.__exit__()
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _wait(what: str, check: Any, timeout_s: float, logs: Path,
          seen: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    tails = {p.name: p.read_text(errors="replace")[-1500:] for p in logs.glob("*.log")}
    pytest.fail(f"timed out waiting for {what} ({seen()}); logs: {tails}")


def _value(prom: PrometheusServer, expr: str) -> float:
    result = prom.query(expr)
    assert len(result) == 1, (expr, result)
    return float(result[0]["value"][1])


def test_every_dashboard_query_returns_data_from_real_prometheus(
        kafka: KafkaConfig, services: tuple[PrometheusServer, OtlpReceiver, Path]) -> None:
    prom, rx, logs = services
    _wait("every target up", lambda: len(prom.targets_up()) == 7
          and all(prom.targets_up().values()), 40, logs)
    t0 = now_us() - 14_000_000
    _publish_only(kafka, _ranks_on_gpus())
    first = episode(JOB, t0, "a")
    _publish(kafka, first)
    _wait("the first wave scraped",
          lambda: prom.query("sum(trainguard_dlq_records_total) >= 1"), 40, logs)
    second = episode(JOB, t0 + 1_000_000, "b", leave_open=True)
    _publish(kafka, second)
    total = len(first) + len(second)
    _wait("the ranks on GPUs scraped", lambda: prom.query(
        f"count(trainguard_rank_info{{job_id=\"{JOB}\"}}) == {len(PLACEMENT)}"), 40, logs)
    # Hostname relabelled to node, joined to the rank: the H100 node's GPU 3 is rank 3.
    joined = prom.query(f'DCGM_FI_DEV_XID_ERRORS * on(node, gpu) group_left(job_id, rank) '
                        f'trainguard_rank_info{{job_id="{JOB}", rank="3"}}')
    assert [(r["metric"]["node"], r["metric"]["gpu"], r["value"][1]) for r in joined] == [
        ("gpu-node-1", "3", "79")]
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
            expr = substitute(q.expr, VALUES)
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
          and {s.name for s in rx.spans()} >= names, 30, logs,
          lambda: f"{len(want - {s.trace_id for s in rx.spans()})} trace(s) and spans "
                  f"{sorted(names - {s.name for s in rx.spans()})} missing")
    got = rx.spans()
    assert {s.trace_id for s in got} == want  # the open incident has no trace yet
    assert {s.name for s in got} >= names
