"""`trainguard import kmsg|faults|steps FILE`: a kernel log, a cluster's fault log or a step
trace -> an event log (JSON lines of valid events, in event-time order) that
`trainguard replay --log` takes: the way to try the rules on your own history.

    trainguard import kmsg dmesg.txt --node gpu-17 --job-id train-42 --out kmsg.jsonl
    trainguard import faults faults.csv --out faults.jsonl
    trainguard import steps trace.csv --map rank=worker,step=iter,compute_ms=fwd_bwd_ms,time=ts \\
        --job-id train-42 --out steps.jsonl
    trainguard import steps job_1_norm.csv --map rank=worker,step=time,compute_ms=batch_time_norm
    cat kmsg.jsonl steps.jsonl > log.jsonl && trainguard replay --log log.jsonl

Bad input is one line naming the file, the line, the field and the value (exit 2); nothing is
written then. Kernel log lines that look like a signal but cannot be read are counted and
reported on stderr (a real log has some), not fatal.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from trainguard.cli.common import CliError, check_ids, input_file
from trainguard.cli.flags import renamed
from trainguard.collectors.health_import import fault_log_format, parse_time_us
from trainguard.events.envelope import Event
from trainguard.incidents.source import write_log
from trainguard.offline.imports import (
    DEFAULT_START_US,
    BadInput,
    Imported,
    fault_events,
    kmsg_events,
    parse_mapping,
    step_events,
    trace_format,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ip = sub.add_parser("import", help="a kernel log, fault log or step trace -> an event log "
                        "for `replay --log`")
    isub = ip.add_subparsers(dest="import_command", required=True, metavar="kmsg|faults|steps")

    k = isub.add_parser("kmsg", help="a kernel log: /dev/kmsg records, dmesg (plain, -T, "
                        "--time-format iso, ...) or journalctl -k (short, short-iso, ...)")
    k.add_argument("file", type=input_file, help="the kernel log, one record or line a line")
    k.add_argument("--node", required=True, help="the node the log is from")
    renamed(k, k.add_argument("--job-id", help="file the events under this job (needed to match "
                              "an OOM-killed pid to a rank of the job); default node:<node>"),
            "--job")
    k.add_argument("--boot-time", metavar="T", help="when the node booted (ISO-8601 or epoch): "
                   "for monotonic stamps ([  12.345678], /dev/kmsg); default the epoch")
    k.add_argument("--year", type=int, help="year of stamps printed without one (journalctl "
                   "short, syslog); default this year or the last")
    _out(k)
    k.set_defaults(func=_kmsg)

    f = isub.add_parser("faults", help="a cluster's fault log (CSV or JSON lines: node, start, "
                        "end, fault_class[, message, code])")
    f.add_argument("file", type=input_file, help="the fault log (.csv, else JSON lines)")
    renamed(f, f.add_argument("--job-id", help="file every event under this job; default "
                              "node:<node> each"), "--job")
    _out(f)
    f.set_defaults(func=_faults)

    s = isub.add_parser("steps", help="a step trace (CSV or JSON lines) with a column mapping")
    s.add_argument("file", type=input_file, help="the trace (.csv/.tsv, else JSON lines)")
    s.add_argument("--map", required=True, metavar="FIELD=COLUMN,...",
                   help="which column is which step.report field: rank, step and compute_ms "
                   "are needed; time (ISO-8601 or epoch s/ms/us/ns; without it step N is at "
                   "--start-time + N x --step-interval-ms), world_size, "
                   "samples_consumed, dp_rank, pp_stage, tp_rank, comm_ms, data_wait_ms, step_ms, "
                   "loss, pid, binding_epoch, node, job")
    renamed(s, s.add_argument("--job-id", help="job id (default: the job column, else "
                              "'imported')"), "--job")
    s.add_argument("--node", help="node of every rank (default: the node column, else none)")
    s.add_argument("--world-size", type=int, help="default: the column, else largest rank + 1")
    renamed(s, s.add_argument("--start-time", metavar="T", help="time of step 0 of a trace "
                              "without a time column (ISO-8601 or epoch; default "
                              "2026-01-01T00:00:00Z)"), "--start")
    s.add_argument("--step-interval-ms", type=float, default=1000.0,
                   help="time between steps of a trace without a time column (default 1000)")
    _out(s)
    s.set_defaults(func=_steps)


def _out(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, help="event log to write (default: stdout)")


def _read(path: Path) -> str:
    if path.is_dir():
        raise CliError(f"{path}: is a directory")
    data = path.read_bytes()  # OSError: one line from cli.main
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise CliError(f"{path}: line {line}: not valid UTF-8 (byte {data[exc.start]:#04x} at "
                       f"offset {exc.start})") from None


def _write(args: argparse.Namespace, got: Imported) -> int:
    events: list[Event] = got.events
    if args.out is None:
        n = write_log(events, sys.stdout.buffer)
        sys.stdout.flush()
    else:
        with args.out.open("wb") as fh:
            n = write_log(events, fh)
    kinds = Counter(e.type for e in events)
    summary = ", ".join(f"{c} {t}" for t, c in sorted(kinds.items())) or "none"
    jobs = sorted({e.job_id for e in events})
    shown = ", ".join(jobs[:3]) + (f" and {len(jobs) - 3} more" if len(jobs) > 3 else "")
    print(f"imported {n} events ({summary}) from {args.file}"
          + (f" under {shown}" if jobs else ""), file=sys.stderr)
    if got.skipped:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(got.skipped.items()))
        print(f"{args.file}: skipped {sum(got.skipped.values())} unreadable line(s) ({parts}); "
              f"first: {got.first_skipped}", file=sys.stderr)
    return 0


def _kmsg(args: argparse.Namespace) -> int:
    text = _read(args.file)
    check_ids(job_id=args.job_id, node=args.node)
    boot = 0
    if args.boot_time is not None:
        try:
            boot = parse_time_us(args.boot_time)
        except ValueError as exc:
            raise CliError(f"--boot-time: {exc}") from None
    if args.year is not None and not 1970 <= args.year <= 9999:
        raise CliError(f"--year: must be between 1970 and 9999 (got {args.year})")
    got = kmsg_events(text, name=str(args.file), node=args.node, job_id=args.job_id,
                      boot_time_us=boot, year=args.year)
    return _write(args, got)


def _faults(args: argparse.Namespace) -> int:
    text = _read(args.file)
    check_ids(job_id=args.job_id)
    try:
        got = fault_events(text, name=str(args.file), fmt=fault_log_format(args.file),
                           job_id=args.job_id)
    except BadInput as exc:
        raise CliError(str(exc)) from None
    return _write(args, got)


def _steps(args: argparse.Namespace) -> int:
    text = _read(args.file)
    check_ids(job_id=args.job_id, node=args.node)
    if args.world_size is not None and args.world_size < 1:
        raise CliError(f"--world-size: must be >= 1 (got {args.world_size})")
    if not 0 < args.step_interval_ms <= 86_400_000:
        raise CliError(f"--step-interval-ms: must be > 0 and at most a day (got "
                       f"{args.step_interval_ms:g})")
    start = DEFAULT_START_US
    if args.start_time is not None:
        try:
            start = parse_time_us(args.start_time)
        except ValueError as exc:
            raise CliError(f"--start-time: {exc}") from None
    try:
        mapping = parse_mapping(args.map)
        got = step_events(text, name=str(args.file), fmt=trace_format(args.file),
                          mapping=mapping, job_id=args.job_id, node=args.node,
                          world_size=args.world_size, start_us=start,
                          step_interval_ms=args.step_interval_ms)
    except BadInput as exc:
        raise CliError(str(exc)) from None
    return _write(args, got)
