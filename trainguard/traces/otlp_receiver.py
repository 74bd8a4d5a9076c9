"""A local OTLP/HTTP traces receiver that records what it got: for tests and for looking at
traces without a collector. Decodes ExportTraceServiceRequest (protobuf, gzip or plain)."""

from __future__ import annotations

import gzip
import threading
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from trainguard.dev.http_server import BackgroundHTTPServer


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: int
    span_id: int
    parent_span_id: int | None
    name: str
    start_ns: int
    end_ns: int
    service: str


class OtlpReceiver:
    """``with OtlpReceiver() as rx:`` -> ``rx.endpoint`` to export to, ``rx.spans()`` got."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._spans: list[ReceivedSpan] = []
        self._headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._server = BackgroundHTTPServer(self._handler(), host, port, name="otlp-rx")

    @property
    def endpoint(self) -> str:
        return f"{self._server.base_url}/v1/traces"

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def headers(self) -> list[dict[str, str]]:
        """Each export request's HTTP headers (names lower-cased), in arrival order."""
        with self._lock:
            return [dict(h) for h in self._headers]

    def __enter__(self) -> OtlpReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    def _record(self, body: bytes) -> None:
        req = ExportTraceServiceRequest.FromString(body)
        got = []
        for rs in req.resource_spans:
            service = next((a.value.string_value for a in rs.resource.attributes
                            if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(ReceivedSpan(
                        int.from_bytes(s.trace_id, "big"), int.from_bytes(s.span_id, "big"),
                        int.from_bytes(s.parent_span_id, "big") if s.parent_span_id else None,
                        s.name, s.start_time_unix_nano, s.end_time_unix_nano, service))
        with self._lock:
            self._spans.extend(got)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                with receiver._lock:
                    receiver._headers.append({k.lower(): v for k, v in self.headers.items()})
                receiver._record(body)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler
