"""`trainguard metrics serve|traces`: the pipeline-metrics service; incident traces from a log."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from trainguard.cli.common import add_kafka_args, input_file, kafka_config
from trainguard.cli.flags import renamed

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    metrics = sub.add_parser("metrics", help="pipeline metrics on /metrics; incident traces")
    m_sub = metrics.add_subparsers(dest="metrics_command", required=True)
    serve = m_sub.add_parser("serve", help="read every event topic (a consumer group) and "
                             "export Prometheus metrics; optionally incident traces over OTLP")
    add_kafka_args(serve)
    renamed(serve, serve.add_argument("--metrics-port", type=int, default=9402,
                                      help="port for /metrics (default 9402)"), "--port")
    renamed(serve, serve.add_argument("--metrics-addr", default="127.0.0.1",
                                      help="address for /metrics (default 127.0.0.1)"), "--addr")
    renamed(serve, serve.add_argument("--group-id", help="consumer group (default "
                                      "<prefix>-metrics)"), "--group")
    renamed(serve, serve.add_argument("--from-offset", choices=["earliest", "latest"],
                                      default="latest", help="where a new consumer group "
                                      "starts (default latest)"), "--from")
    renamed(serve, serve.add_argument("--series-ttl-s", type=float, default=3600.0,
                                      help="seconds of event time after which a silent job's "
                                      "series go (default 3600)"), "--series-ttl")
    renamed(serve, serve.add_argument("--watch-group-id", action="append", default=[],
                                      metavar="GROUP", help="also export this consumer group's "
                                      "lag per topic (repeatable), e.g. the streams app id"),
            "--watch-group")
    _otlp_arg(serve)
    renamed(serve, serve.add_argument("--duration-s", type=float,
                                      help="stop after this many seconds (default: run until "
                                      "signalled)"), "--duration")
    serve.set_defaults(func=_serve)
    traces = m_sub.add_parser("traces", help="build incident traces from a JSON-lines event "
                              "log (`trainguard events tail` output) and export them")
    traces.add_argument("file", type=input_file, help="JSON-lines event log")
    _otlp_arg(traces)
    traces.add_argument("--all", action="store_true", help="also incidents not yet ended")
    traces.set_defaults(func=_traces)


def _otlp_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--otlp-endpoint", help="OTLP/HTTP traces endpoint, e.g. "
                   "http://collector:4318/v1/traces (default $TRAINGUARD_OTLP_ENDPOINT, else "
                   "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT + "
                   "/v1/traces; none: no traces; headers and timeout from OTEL_*: docs/cli.md)")


def _serve(args: argparse.Namespace) -> int:
    from prometheus_client import start_http_server

    from trainguard.bus.kafka import KafkaBus
    from trainguard.metrics.recorder import Recorder
    from trainguard.metrics.registry import PipelineMetrics
    from trainguard.metrics.service import EventSink, MetricsService
    from trainguard.traces.provider import otlp_emitter, otlp_settings
    from trainguard.traces.sink import IncidentTraceSink

    cfg = kafka_config(args, client_id="trainguard-metrics")
    recorder = Recorder(PipelineMetrics(), series_ttl_s=args.series_ttl_s)
    sinks: list[EventSink] = []
    otlp = otlp_settings(args.otlp_endpoint)
    endpoint = otlp.endpoint if otlp else None
    emitter = otlp_emitter(otlp, service_name="trainguard-metrics") if otlp else None
    if emitter is not None:
        sinks.append(IncidentTraceSink(emitter))
    start_http_server(args.metrics_port, addr=args.metrics_addr,
                      registry=recorder.metrics.registry)
    log.warning("metrics: /metrics on %s:%d, topics %s.*, traces %s", args.metrics_addr,
                args.metrics_port,
                cfg.topic_prefix, endpoint or "off")

    async def main() -> None:
        service = MetricsService(KafkaBus(cfg), recorder, group_id=args.group_id or
                                 f"{cfg.topic_prefix}-metrics", from_offset=args.from_offset,
                                 sinks=sinks, watch_groups=args.watch_group_id)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, service.stopping.set)
        if args.duration_s:
            loop.call_later(args.duration_s, service.stopping.set)
        await service.run()

    try:
        asyncio.run(main())
    finally:
        if emitter is not None:
            emitter.provider.shutdown()
    return 0


def _traces(args: argparse.Namespace) -> int:
    from trainguard.events.codec import decode
    from trainguard.events.errors import ContractError
    from trainguard.traces.plan import plan_traces
    from trainguard.traces.provider import otlp_emitter, otlp_settings

    otlp = otlp_settings(args.otlp_endpoint)  # a bad OTEL_* variable: one line, before reading
    events = []
    with args.file.open("rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    events.append(decode(line))
                except ContractError as err:
                    print(f"{args.file}:{lineno}: {err}", file=sys.stderr)
                    return 2
    plans = [p for p in plan_traces(events) if p.complete or args.all]
    emitter = otlp_emitter(otlp, service_name="trainguard-replay") if otlp else None
    for plan in plans:
        if emitter is not None:
            emitter.emit(plan)
        print(f"{plan.incident_id} trace {plan.trace_id:032x} job {plan.job_id} "
              f"{plan.final_state or 'open'}: " + ", ".join(s.name for s in plan.spans[1:]))
    if emitter is not None:
        emitter.provider.shutdown()
    return 0
