"""`trainguard streams`: the faust worker applying the rules to the event log."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from trainguard.cli.common import add_kafka_args, input_file, kafka_config
from trainguard.cli.flags import renamed
from trainguard.dev.paths import state_dir
from trainguard.streams.limits import BUFFER_RECORDS, FETCH_BYTES

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("streams", help="run a streams worker: rules over the event log")
    add_kafka_args(p)
    p.add_argument("--rules", type=input_file, help="rule file (default: the shipped rule set)")
    p.add_argument("--app-id", help="faust app id (default <prefix>-streams); workers with "
                   "the same id share the partitions")
    renamed(p, p.add_argument("--data-dir", type=Path, help="faust data dir (default "
                              "$TRAINGUARD_STATE/streams-<app id>)"), "--datadir")
    renamed(p, p.add_argument("--http-port", type=int, help="port of faust's web server "
                              "(default: off)"), "--web-port")
    renamed(p, p.add_argument("--http-addr", default=os.environ.get(
        "TRAINGUARD_STREAMS_WEB_ADDR", "127.0.0.1"), help="address faust's web server listens "
        "on (default $TRAINGUARD_STREAMS_WEB_ADDR or 127.0.0.1: loopback only)"), "--web-addr")
    p.add_argument("--batch-size", type=int, default=1000, metavar="N",
                   help="most records evaluated per batch (default 1000); a smaller batch "
                   "lets a prompt verdict out sooner when telemetry floods the worker")
    renamed(p, p.add_argument("--batch-within-s", type=float, default=0.05, metavar="S",
                              help="longest wait to fill a batch of records (default 0.05 s)"),
            "--batch-within")
    renamed(p, p.add_argument("--commit-interval-s", type=float, default=0.2, metavar="S",
                              help="exactly-once commit period: verdicts are visible to "
                              "read-committed consumers once committed (default 0.2 s)"),
            "--commit-interval")
    p.add_argument("--buffer-records", type=int, default=BUFFER_RECORDS, metavar="N",
                   help="records fetched ahead per agent (faust's stream buffer; default "
                   f"{BUFFER_RECORDS}): an urgent copy can wait behind this many")
    p.add_argument("--fetch-bytes", type=int, default=FETCH_BYTES, metavar="N",
                   help=f"most bytes fetched per partition and request (default {FETCH_BYTES})")
    p.add_argument("--no-prompt", action="store_true",
                   help="decide process exits, must-drain XIDs and link downs only in "
                   "event-time order (after the lateness bound), not on arrival")
    p.add_argument("--no-backlog-hold", action="store_true",
                   help="do not hold a job's watermark while agents drain a spooled backlog "
                   "after a shared outage (docs/rules.md, \"Backlog hold\")")
    p.add_argument("--actuator-pubkeys", type=input_file, help="trusted actuator public keys: the "
                   "rules take binding epochs from the pool events they sign (default "
                   "$TRAINGUARD_ACTUATOR_PUBKEYS_FILE, else $TRAINGUARD_ACTUATOR_PUBKEYS; "
                   "none: no binding is believed, stale replicas' reports are evaluated)")
    renamed(p, p.add_argument("--log-level", default="warn",
                              choices=["crit", "error", "warn", "info", "debug"],
                              help="faust worker's log level (default warn)"), "--loglevel")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from faust import Worker

    from trainguard.actuators import signing
    from trainguard.bus.admin import check_transactions, topic_partitions
    from trainguard.events.topics import TopicNames, TopicRole
    from trainguard.rules import engine_factory, load_default_rules, load_rules
    from trainguard.streams.app import build_app

    check = None
    if args.actuator_pubkeys is not None or signing.has_actuator_pubkeys():
        try:
            keys = signing.load_actuator_pubkeys(key_file=args.actuator_pubkeys)
        except signing.SigningKeyError as exc:
            raise SystemExit(f"trainguard streams: {exc}") from None
        check = signing.Trust(actuators=keys).check
    cfg = kafka_config(args, client_id="trainguard-streams")
    rules = load_rules(args.rules) if args.rules else load_default_rules()
    names = TopicNames(cfg.topic_prefix)
    partitions = asyncio.run(topic_partitions(cfg, names.name(TopicRole.TASK)))
    if partitions == 0:
        raise SystemExit(f"topic {names.name(TopicRole.TASK)} does not exist: run "
                         "`trainguard topics create` first")
    for role in (TopicRole.TELEMETRY, TopicRole.URGENT):
        count = asyncio.run(topic_partitions(cfg, names.name(role)))
        if count != partitions:
            raise SystemExit(f"topic {names.name(role)} has {count} partitions, "
                             f"{names.name(TopicRole.TASK)} {partitions}: both are keyed by job "
                             "and must have as many, so a job's records meet in one worker")
    if check is not None:
        outcomes = asyncio.run(topic_partitions(cfg, names.name(TopicRole.OUTCOMES)))
        if outcomes != partitions:
            raise SystemExit(f"topic {names.name(TopicRole.OUTCOMES)} has {outcomes} "
                             f"partitions, {names.name(TopicRole.TASK)} {partitions}: the "
                             "rules read the actuators' bindings from it, keyed by job, so it "
                             "must have as many")
    else:
        log.warning("streams: no trusted actuator keys: binding epochs are not known, the "
                    "reports of stale replicas are evaluated")
    app_id = args.app_id or f"{cfg.topic_prefix}-streams"
    refused = asyncio.run(check_transactions(cfg, f"{app_id}-preflight"))
    if refused:  # faust would carry on without exactly-once (it only logs a warning)
        print(f"trainguard streams: the broker refuses transactions to "
              f"{cfg.sasl_username or 'this client'}: {refused}", file=sys.stderr)
        return 2
    app = build_app(cfg, engine_factory(rules, prompt=not args.no_prompt,
                                         backlog_hold=not args.no_backlog_hold),
                    partitions=partitions, app_id=app_id,
                    datadir=args.data_dir or state_dir() / f"streams-{app_id}",
                    web_port=args.http_port, web_addr=args.http_addr,
                    batch_size=args.batch_size,
                    batch_within_s=args.batch_within_s,
                    commit_interval_s=args.commit_interval_s, check=check,
                    buffer_records=args.buffer_records, fetch_bytes=args.fetch_bytes)
    log.warning("streams %s: %d partitions, rules %s", app_id, partitions, rules.version)
    Worker(app, loglevel=args.log_level, quiet=True).execute_from_commandline()
    return 0
