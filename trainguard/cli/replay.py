"""`trainguard replay [--since T] [--until T] [--rules FILE] [--log FILE]`: re-run the rules and the
incident fold over the recorded log; `trainguard replay export`: the log as JSON lines."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import orjson

from trainguard.cli.common import input_file
from trainguard.cli.flags import renamed
from trainguard.cli.incident import load_log, settings_of
from trainguard.events.envelope import Event
from trainguard.incidents.source import write_log
from trainguard.replay.report import render_report, report_doc
from trainguard.replay.run import replay_log
from trainguard.replay.window import Window
from trainguard.rules import load_default_rules, load_rules

WHEN = "ISO time (2026-01-01T00:00:05Z), epoch microseconds, or an offset from the log's " \
       "start or end: start+30s, end-5m (also +30s, and -5m written as --until=-5m)"


EPILOG = """\
modes (the first line of the report, "mode" in --json):
  reproduce            the log records verdicts and these are the rules that decided them:
                       the rules and the incident fold are run again and compared
  what_if_rules        --rules differ from the recording's: what would have changed
  what_if_unrecorded   the log records no verdicts (e.g. written by `trainguard import`):
                       nothing to reproduce; every verdict and incident the rules find is listed
exit codes:
  0  reproduced exactly, or a what-if run (of either kind) completed
  1  a reproduction differs: the recording's own rules decided otherwise
  2  bad input: a missing or malformed log or rule file, a bad window, no broker
"""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rp = sub.add_parser("replay", help="replay the log: reproduce or what-if; export it",
                        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common(rp)
    rp.add_argument("--rules", type=input_file,
                    help="rule file (default: the shipped default rules)")
    rp.add_argument("--json", action="store_true",
                    help="the comparison as JSON: mode, exit_code, every gone/new/changed "
                    "verdict (kind, subject, severity, state, evidence) and every incident")
    rp.add_argument("--actuator-pubkeys", type=input_file, help="trusted actuator public keys: the "
                    "rules take binding epochs from the pool events they sign, as the live "
                    "worker does (default $TRAINGUARD_ACTUATOR_PUBKEYS_FILE, else "
                    "$TRAINGUARD_ACTUATOR_PUBKEYS; none: no binding is believed)")
    rp.add_argument("--join-window-ms", type=int, default=30_000,
                    help="a verdict this soon after an incident opened joins it (default 30000)")
    rp.add_argument("--lateness-ms", type=int, default=15_000,
                    help="event-time lateness of the incident fold (default 15000)")
    rp.set_defaults(func=_replay)
    rp_sub = rp.add_subparsers(dest="replay_command", required=False, metavar="export")
    ex = rp_sub.add_parser("export", help="write the log (or a window of it) as JSON lines")
    _common(ex, default=argparse.SUPPRESS)  # given before or after `export`, both count
    ex.add_argument("--out", type=Path, help="file to write (default: stdout)")
    ex.set_defaults(func=_export)


def _common(p: argparse.ArgumentParser, default: object = None) -> None:
    p.add_argument("--bootstrap", default=default, help="Kafka bootstrap servers (default: "
                   "$TRAINGUARD_KAFKA_BOOTSTRAP, else the dev broker if running)")
    p.add_argument("--prefix", default=default, help="topic prefix")
    p.add_argument("--log", type=input_file, default=default,
                   help="an exported JSON-lines log instead of the topics")
    renamed(p, p.add_argument("--since", metavar="T", default=default,
                              help="start of the window: " + WHEN), "--from")
    renamed(p, p.add_argument("--until", metavar="T", default=default,
                              help="end of the window: " + WHEN), "--to")
    renamed(p, p.add_argument("--job-id", default=default, help="only this job"), "--job")


def _window(args: argparse.Namespace, events: list[Event]) -> Window:
    if not events:
        return Window()
    times = [e.event_time for e in events]
    return Window.parse(args.since, args.until, first=min(times), last=max(times))


def _load(args: argparse.Namespace) -> tuple[list[Event], Window]:
    events = load_log(args)
    if args.job_id:
        events = [e for e in events if e.job_id == args.job_id]
    return events, _window(args, events)


def _replay(args: argparse.Namespace) -> int:
    from trainguard.actuators import signing

    # a bad file, window, rule set or key, or no broker: one line and exit 2, from cli.main
    rules = load_rules(args.rules) if args.rules else load_default_rules()
    check = None
    if args.actuator_pubkeys is not None or signing.has_actuator_pubkeys():
        keys = signing.load_actuator_pubkeys(key_file=args.actuator_pubkeys)
        check = signing.Trust(actuators=keys).check
    events, window = _load(args)
    result = replay_log(events, rules, window, settings_of(args), check)
    if args.json:
        sys.stdout.write(orjson.dumps(report_doc(result), option=orjson.OPT_INDENT_2).decode()
                         + "\n")
    else:
        sys.stdout.write(render_report(result))
    return result.exit_code


def _export(args: argparse.Namespace) -> int:
    events, window = _load(args)
    chosen = [e for e in events if window.contains(e.event_time)]
    if args.out is None:
        n = write_log(chosen, sys.stdout.buffer)
    else:
        with args.out.open("wb") as fh:
            n = write_log(chosen, fh)
    print(f"exported {n} events", file=sys.stderr)
    return 0
