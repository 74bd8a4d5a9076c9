"""The OTLP/HTTP exporter, configured by flag or environment, delivers the planned traces to a
local receiver (a real HTTP server on loopback that records what it got)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.cli.main import main
from trainguard.events.codec import encode
from trainguard.metrics.scenario import episode
from trainguard.traces.otlp_receiver import OtlpReceiver
from trainguard.traces.plan import plan_traces
from trainguard.traces.provider import otlp_endpoint

LOG = episode("job-otlp", 1_790_000_000_000_000, leave_open=True)


def test_endpoint_comes_from_the_flag_then_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRAINGUARD_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    assert otlp_endpoint(None) is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://otel:4318/v1/traces")
    assert otlp_endpoint(None) == "http://otel:4318/v1/traces"
    monkeypatch.setenv("TRAINGUARD_OTLP_ENDPOINT", "http://tg:4318/v1/traces")
    assert otlp_endpoint(None) == "http://tg:4318/v1/traces"
    assert otlp_endpoint("http://flag/v1/traces") == "http://flag/v1/traces"


def test_traces_from_a_log_arrive_over_otlp_with_the_planned_ids(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(encode(e) + b"\n" for e in LOG))
    ended = [p for p in plan_traces(LOG) if p.complete]
    with OtlpReceiver() as rx:
        assert main(["metrics", "traces", str(path), "--otlp-endpoint", rx.endpoint]) == 0
        got = rx.spans()
    capsys.readouterr()
    want = {(p.trace_id, s.span_id, s.parent_id, s.name, s.start_us * 1000, s.end_us * 1000)
            for p in ended for s in p.spans}
    assert {(s.trace_id, s.span_id, s.parent_span_id, s.name, s.start_ns, s.end_ns)
            for s in got} == want
    assert {s.service for s in got} == {"trainguard-replay"}
