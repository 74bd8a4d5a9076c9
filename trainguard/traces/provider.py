"""Where incident traces go: OTLP over HTTP (endpoint from a flag or the OTEL_* environment),
or any SpanExporter handed in (the SDK's in-memory exporter in tests)."""

from __future__ import annotations

import os

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)

from trainguard.traces.emit import PlannedIds, TraceEmitter

ENDPOINT_ENV = ("TRAINGUARD_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def otlp_endpoint(flag: str | None) -> str | None:
    """The flag, else $TRAINGUARD_OTLP_ENDPOINT, else $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT."""
    if flag:
        return flag
    return next((os.environ[k] for k in ENDPOINT_ENV if os.environ.get(k)), None)


def emitter_for(exporter: SpanExporter, *, batch: bool = False,
                service_name: str = "trainguard") -> TraceEmitter:
    ids = PlannedIds()
    provider = TracerProvider(id_generator=ids,
                              resource=Resource.create({"service.name": service_name}))
    processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    return TraceEmitter(provider, ids)


def otlp_emitter(endpoint: str, *, service_name: str = "trainguard") -> TraceEmitter:
    """OTLP/HTTP (protobuf) to ``endpoint``, e.g. http://collector:4318/v1/traces."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return emitter_for(OTLPSpanExporter(endpoint=endpoint), batch=True,
                       service_name=service_name)
