"""Where incident traces go: OTLP over HTTP (endpoint, headers, timeout from a flag or the
OTEL_* environment, per the OTel spec: docs/cli.md),
or any SpanExporter handed in (the SDK's in-memory exporter in tests)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)

from trainguard.traces.emit import PlannedIds, TraceEmitter

ENDPOINT_ENV = ("TRAINGUARD_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
GENERIC_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_PATH = "v1/traces"
DEFAULT_TIMEOUT_MS = 10_000
PROTOCOL = "http/protobuf"
COMPRESSIONS = ("none", "gzip", "deflate")


class OtlpConfigError(ValueError):
    """An OTEL_* variable this exporter cannot honour (named in the message)."""


@dataclass(frozen=True)
class OtlpSettings:
    """Where and how traces go, resolved from the flag and the environment (docs/cli.md)."""

    endpoint: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_MS / 1000
    compression: str = "none"


def _signal(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """``OTEL_EXPORTER_OTLP_TRACES_<name>``, else ``OTEL_EXPORTER_OTLP_<name>``: (var, value)."""
    for var in (f"OTEL_EXPORTER_OTLP_TRACES_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        if env.get(var, "").strip():
            return var, env[var].strip()
    return None


def parse_headers(var: str, text: str) -> dict[str, str]:
    """``key=value,key2=value2`` (W3C baggage style, values URL-encoded), as the spec says."""
    headers: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise OtlpConfigError(f"${var}: {item.strip()!r} is not key=value")
        headers[unquote(key.strip()).lower()] = unquote(value.strip())
    return headers


def otlp_settings(flag: str | None, env: Mapping[str, str] | None = None) -> OtlpSettings | None:
    """The flag (given explicitly, it wins), else $TRAINGUARD_OTLP_ENDPOINT, else the
    per-signal $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (as is), else the generic
    $OTEL_EXPORTER_OTLP_ENDPOINT + ``/v1/traces``; None: no traces. Headers, timeout (ms),
    compression and protocol: the per-signal variable, else the generic one."""
    env = os.environ if env is None else env
    endpoint = flag or None
    disabled = env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none" or \
        env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"
    if endpoint is None and not disabled:
        endpoint = next((env[k].strip() for k in ENDPOINT_ENV if env.get(k, "").strip()), None)
        base = env.get(GENERIC_ENDPOINT, "").strip()
        if endpoint is None and base:
            endpoint = f"{base.removesuffix('/')}/{TRACES_PATH}"
    if endpoint is None:
        return None
    protocol = _signal(env, "PROTOCOL")
    if protocol is not None and protocol[1] != PROTOCOL:
        raise OtlpConfigError(f"${protocol[0]}: {protocol[1]!r}: only {PROTOCOL} is supported")
    headers = _signal(env, "HEADERS")
    timeout_ms = float(DEFAULT_TIMEOUT_MS)
    timeout = _signal(env, "TIMEOUT")
    if timeout is not None:
        try:
            timeout_ms = float(timeout[1])
        except ValueError:
            timeout_ms = -1
        if not 0 < timeout_ms < float("inf"):
            raise OtlpConfigError(f"${timeout[0]}: {timeout[1]!r} is not a positive number "
                                  "of milliseconds")
    compression = _signal(env, "COMPRESSION")
    if compression is not None and compression[1].lower() not in COMPRESSIONS:
        raise OtlpConfigError(f"${compression[0]}: {compression[1]!r} is not one of "
                              f"{', '.join(COMPRESSIONS)}")
    return OtlpSettings(endpoint=endpoint,
                        headers=parse_headers(*headers) if headers else {},
                        timeout_s=timeout_ms / 1000,
                        compression=compression[1].lower() if compression else "none")


def otlp_endpoint(flag: str | None) -> str | None:
    """The endpoint ``otlp_settings`` resolves (None: no traces)."""
    settings = otlp_settings(flag)
    return settings.endpoint if settings else None


def emitter_for(exporter: SpanExporter, *, batch: bool = False,
                service_name: str = "trainguard") -> TraceEmitter:
    ids = PlannedIds()
    provider = TracerProvider(id_generator=ids,
                              resource=Resource.create({"service.name": service_name}))
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    return TraceEmitter(provider, ids)


def otlp_emitter(where: str | OtlpSettings, *, service_name: str = "trainguard"
                 ) -> TraceEmitter:
    """OTLP/HTTP (protobuf) to an endpoint, e.g. http://collector:4318/v1/traces, with the
    headers, timeout and compression ``otlp_settings`` resolved."""
    from opentelemetry.exporter.otlp.proto.http import Compression
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    settings = OtlpSettings(where) if isinstance(where, str) else where
    exporter = OTLPSpanExporter(endpoint=settings.endpoint, headers=settings.headers,
                                timeout=settings.timeout_s,
                                compression=Compression(settings.compression))
    return emitter_for(exporter, batch=True, service_name=service_name)
