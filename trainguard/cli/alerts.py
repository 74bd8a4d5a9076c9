"""`trainguard alerts`: incident transitions to chat and Alertmanager (run), a config check
(check), and a local receiver that records what it gets (receiver, for the demo)."""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from trainguard.cli.common import add_kafka_args, input_file, kafka_config, run_until_stopped
from trainguard.cli.flags import renamed

if TYPE_CHECKING:
    from trainguard.alerts.config import AlertsConfig

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("alerts", help="alerts to chat: run the service, check a config, "
                       "or run a local webhook receiver")
    cmds = p.add_subparsers(dest="alerts_command", required=True, metavar="ACTION")

    run = cmds.add_parser("run", help="consume incident transitions and post alerts")
    add_kafka_args(run)
    run.add_argument("--config", type=input_file, required=True, help="alerts YAML (channels)")
    run.add_argument("--group-id", help="consumer group (default <prefix>-alerts)")
    run.add_argument("--from-offset", choices=["latest", "earliest"], default="latest",
                     help="where a new consumer group starts (default latest: no alerts "
                     "for history)")
    run.add_argument("--metrics-port", type=int, default=9405, help="/metrics port (0: none)")
    run.add_argument("--metrics-addr", default="127.0.0.1", help="address for /metrics")
    renamed(run, run.add_argument("--duration-s", type=float, help="stop after this many "
                                  "seconds (default: run until signalled)"), "--duration")
    run.set_defaults(func=_run)

    check = cmds.add_parser("check", help="validate a config and resolve its secrets")
    check.add_argument("--config", type=input_file, required=True,
                       help="alerts YAML (channels) to check")
    check.set_defaults(func=_check)

    rx = cmds.add_parser("receiver", help="a local HTTP receiver that records every request "
                         "(JSON lines) and answers like the chat vendors")
    renamed(rx, rx.add_argument("--http-port", type=int, default=0,
                                help="HTTP port on 127.0.0.1 (default 0: a free one)"), "--port")
    rx.add_argument("--out", type=Path, required=True, help="JSON-lines file to append to")
    renamed(rx, rx.add_argument("--duration-s", type=float, help="stop after this many "
                                "seconds (default: run until interrupted)"), "--duration")
    rx.set_defaults(func=_receiver)


def _load(path: Path) -> AlertsConfig:
    from trainguard.alerts.config import ConfigError, load

    try:
        return load(path)
    except ConfigError as err:
        where = "" if str(err).startswith(str(path)) else f"{path}: "
        raise SystemExit(f"trainguard alerts: config {where}{err}") from None


def _check(args: argparse.Namespace) -> int:
    config = _load(args.config)
    for built in config.channels:
        p = built.channel.policy
        limits = ", ".join(f"{lim.count}/{lim.per_s:g}s" for lim in p.limits)
        print(f"{p.name}: {p.kind}, limits {limits}, up to {built.backoff.max_attempts} "
              f"attempts" + (f", re-sent every {p.resend_s:g}s" if p.resend_s else ""))
    print(f"coalescing: hold {config.coalesce.hold_s:g}s")
    return 0


def _run(args: argparse.Namespace) -> int:
    from trainguard.alerts.secrets import install_redaction
    from trainguard.alerts.service import AlertsService, ServiceOptions
    from trainguard.bus.kafka import KafkaBus

    config = _load(args.config)
    install_redaction(config.redactor)
    cfg = kafka_config(args, client_id="trainguard-alerts")
    service = AlertsService(config, KafkaBus(cfg), ServiceOptions(
        group_id=args.group_id or f"{cfg.topic_prefix}-alerts", from_offset=args.from_offset))
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_addr,
                          registry=service.metrics.registry)
        log.warning("alerts: /metrics on %s:%d", args.metrics_addr, args.metrics_port)

    log.warning("alerts: %d channel(s): %s", len(config.channels),
                ", ".join(b.channel.policy.name for b in config.channels))
    run_until_stopped(service.run, args.duration_s)
    return 0


def _receiver(args: argparse.Namespace) -> int:
    from trainguard.dev.webhook_receiver import Route, WebhookReceiver

    routes = [Route("slack", "/slack/", reply=b"ok"), Route("any", "/")]
    rx = WebhookReceiver(routes, port=args.http_port, record_to=args.out).start()
    print(f"receiving on {rx.base_url} (Slack-style answers under /slack/, JSON elsewhere); "
          f"recording to {args.out}", flush=True)
    stop = time.monotonic() + args.duration_s if args.duration_s else None
    try:
        while stop is None or time.monotonic() < stop:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        rx.stop()
    return 0
