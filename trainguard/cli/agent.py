"""`trainguard agent`: the node agent — this node's collectors into Kafka, one record per
interval, spooled through broker outages, its own health on /metrics."""

from __future__ import annotations

import argparse
import logging
import socket
from pathlib import Path

from trainguard.cli.common import (
    CliError,
    add_kafka_args,
    check_ids,
    input_file,
    kafka_config,
    run_until_stopped,
)
from trainguard.cli.flags import renamed
from trainguard.dev.paths import state_dir

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("agent", help="run this node's collectors and publish to Kafka")
    add_kafka_args(p)
    p.add_argument("--node", default=socket.gethostname(), help="this node's name")
    p.add_argument("--job-id", help="job id for node-level records (default node:<node>)")
    renamed(p, p.add_argument("--interval-s", type=float, default=1.0,
                              help="sampling interval in seconds (default 1, down to 0.1)"),
            "--interval")
    p.add_argument("--spool-dir", type=Path, help="on-disk spool (default $TRAINGUARD_STATE/"
                   "agent-<node>/spool)")
    p.add_argument("--spool-max-mb", type=float, default=256.0, help="spool budget in MiB")
    p.add_argument("--metrics-port", type=int, default=9401,
                   help="port for /metrics (0: none)")
    p.add_argument("--metrics-addr", default="127.0.0.1", help="address for /metrics")
    p.add_argument("--socket", type=Path, help="step-report socket (default: the SDK's)")
    p.add_argument("--gpu", choices=["auto", "nvml", "dcgm", "smi", "none"], default="auto",
                   help="GPU source (auto: NVML if present, else none)")
    p.add_argument("--dcgm-url", default="http://127.0.0.1:9400/metrics",
                   help="dcgm-exporter endpoint for --gpu dcgm")
    p.add_argument("--interfaces", nargs="*", help="NICs to watch (default: all but lo)")
    p.add_argument("--peer", action="append", default=[],
                   help="peer address of the job to measure RTT/retransmits toward")
    p.add_argument("--no-kernel-log", action="store_true", help="do not follow the kernel log")
    p.add_argument("--fault-log", type=input_file, help="a node fault log (JSONL/CSV) to import")
    p.add_argument("--discover", action="store_true",
                   help="also watch processes whose environment has TRAINGUARD_JOB_ID")
    renamed(p, p.add_argument("--duration-s", type=float, help="stop after this many seconds "
                              "(default: run until signalled)"), "--duration")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from trainguard.agent.build import AgentOptions, build_agent

    if args.fault_log is not None and args.fault_log.exists() and not args.fault_log.is_file():
        # a missing fault log is followed until it appears; anything else is a mistake
        raise CliError(f"--fault-log {args.fault_log}: not a regular file")
    check_ids(job_id=args.job_id, node=args.node)
    cfg = kafka_config(args, client_id=f"trainguard-agent-{args.node}")
    opts = AgentOptions(
        node=args.node, job_id=args.job_id, interval_s=args.interval_s,
        spool_dir=args.spool_dir or state_dir() / f"agent-{args.node}" / "spool",
        spool_max_bytes=int(args.spool_max_mb * (1 << 20)), socket_path=args.socket,
        gpu=args.gpu, dcgm_url=args.dcgm_url, interfaces=args.interfaces, peers=args.peer,
        kernel_log=not args.no_kernel_log, fault_log=args.fault_log, discover=args.discover)
    built = build_agent(opts, cfg)
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_addr,
                          registry=built.metrics.registry)
        log.warning("agent %s: /metrics on %s:%d", args.node, args.metrics_addr,
                    args.metrics_port)

    try:
        run_until_stopped(built.run, args.duration_s)
    finally:
        built.close()
    return 0
