"""OTLP settings from the flag and the OTEL_* environment, per the OTel spec's precedence
(per-signal > generic > default; an explicit flag wins): resolved purely, then delivered to a
real local receiver with the headers and the compression the environment names."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.cli.main import main
from trainguard.events.codec import encode
from trainguard.metrics.scenario import episode
from trainguard.traces.otlp_receiver import OtlpReceiver
from trainguard.traces.provider import OtlpConfigError, otlp_settings

pytestmark = pytest.mark.unit

LOG = episode("job-otlp-env", 1_790_000_000_000_000)


def test_endpoint_precedence_flag_then_trainguard_then_per_signal_then_generic() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318/"}
    assert otlp_settings(None, {}) is None
    got = otlp_settings(None, env)
    assert got is not None and got.endpoint == "http://base:4318/v1/traces"  # path appended
    env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "http://sig:4318/custom"  # used as is
    got = otlp_settings(None, env)
    assert got is not None and got.endpoint == "http://sig:4318/custom"
    env["TRAINGUARD_OTLP_ENDPOINT"] = "http://tg:4318/v1/traces"
    got = otlp_settings(None, env)
    assert got is not None and got.endpoint == "http://tg:4318/v1/traces"
    got = otlp_settings("http://flag/v1/traces", env)
    assert got is not None and got.endpoint == "http://flag/v1/traces"


def test_exporter_off_switches_turn_the_variables_off_not_the_flag() -> None:
    for off in ({"OTEL_TRACES_EXPORTER": "none"}, {"OTEL_SDK_DISABLED": "true"}):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318", **off}
        assert otlp_settings(None, env) is None
        got = otlp_settings("http://flag/v1/traces", env)
        assert got is not None and got.endpoint == "http://flag/v1/traces"


def test_headers_timeout_and_compression_per_signal_before_generic() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://base:4318",
           "OTEL_EXPORTER_OTLP_HEADERS": "x-generic=1",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "2500",
           "OTEL_EXPORTER_OTLP_COMPRESSION": "deflate"}
    got = otlp_settings(None, env)
    assert got is not None
    assert (got.headers, got.timeout_s, got.compression) == ({"x-generic": "1"}, 2.5, "deflate")
    env.update({"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "Authorization=Bearer%20t0k,x-b=a%3Db",
                "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "500",
                "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "gzip"})
    got = otlp_settings(None, env)
    assert got is not None
    assert got.headers == {"authorization": "Bearer t0k", "x-b": "a=b"}
    assert (got.timeout_s, got.compression) == (0.5, "gzip")
    default = otlp_settings("http://flag", {})
    assert default is not None and (default.timeout_s, default.headers) == (10.0, {})


@pytest.mark.parametrize(("var", "value", "said"), [
    ("OTEL_EXPORTER_OTLP_HEADERS", "novalue", "is not key=value"),
    ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon", "milliseconds"),
    ("OTEL_EXPORTER_OTLP_TIMEOUT", "-1", "milliseconds"),
    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "only http/protobuf"),
    ("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "zstd", "is not one of"),
])
def test_a_bad_variable_is_named(var: str, value: str, said: str) -> None:
    with pytest.raises(OtlpConfigError, match=said) as info:
        otlp_settings(None, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://b:4318", var: value})
    assert str(info.value).startswith(f"${var}: ")


def test_the_generic_variable_alone_delivers_with_its_headers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TRAINGUARD_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(encode(e) + b"\n" for e in LOG))
    with OtlpReceiver() as rx:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint.removesuffix("/v1/traces"))
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=team%20a")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        assert main(["metrics", "traces", str(path)]) == 0
        spans, headers = rx.spans(), rx.headers()
    capsys.readouterr()
    assert spans and {s.service for s in spans} == {"trainguard-replay"}
    assert headers and all(h.get("x-tenant") == "team a" for h in headers)
    assert all(h.get("content-encoding") == "gzip" for h in headers)


def test_a_bad_variable_is_one_line_from_the_cli(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(encode(e) + b"\n" for e in LOG))
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert main(["metrics", "traces", str(path), "--otlp-endpoint", "http://127.0.0.1:9"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "OTEL_EXPORTER_OTLP_PROTOCOL" in err[0], err
