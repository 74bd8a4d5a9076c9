"""`trainguard incident list|show|serve`: incidents rebuilt from the log, their timelines, and
the service that publishes incident transitions."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from trainguard.bus.kafka import KafkaBus
from trainguard.cli.common import (
    CliError,
    add_kafka_args,
    input_file,
    kafka_config,
    run_until_stopped,
)
from trainguard.cli.flags import renamed
from trainguard.dev.paths import state_dir
from trainguard.events.clock import to_iso
from trainguard.events.envelope import Event
from trainguard.incidents.context import EventContext
from trainguard.incidents.live import LiveIncidents
from trainguard.incidents.query import find, incident_views
from trainguard.incidents.service import Snapshots, serve
from trainguard.incidents.settings import IncidentSettings
from trainguard.incidents.snapshot import SnapshotStore
from trainguard.incidents.source import read_log_file, read_topics
from trainguard.timeline import FORMATS, build_timeline, render


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    inc = sub.add_parser("incident", help="incidents: list, timeline, the incident service")
    inc_sub = inc.add_subparsers(dest="incident_command", required=True)
    ls = inc_sub.add_parser("list", help="every incident in the log, oldest first")
    _log_args(ls)
    ls.set_defaults(func=_list)
    show = inc_sub.add_parser("show", help="one incident's timeline and the four answers")
    show.add_argument("id", metavar="ID", help="incident id or a unique prefix (4+ chars)")
    _log_args(show)
    show.add_argument("--format", choices=sorted(FORMATS), default="text",
                      help="text (default), md, html (a self-contained page) or json")
    show.add_argument("--out", type=Path, help="write to this file instead of stdout")
    show.set_defaults(func=_show)
    srv = inc_sub.add_parser("serve", help="consume the log, publish incident transitions")
    add_kafka_args(srv)
    _settings_args(srv)
    renamed(srv, srv.add_argument("--group-id", help="consumer group (default: "
                                  "<prefix>-incidents)"), "--group")
    srv.add_argument("--idle-flush-s", type=float, default=5.0,
                     help="flush the reorder buffer after this long without input")
    srv.add_argument("--state-dir", type=Path, help="where the fold's snapshot (state + the "
                     "offsets it covers) is kept: a restart reads on from there instead of "
                     "from earliest (default $TRAINGUARD_STATE/incidents-<group id>)")
    srv.add_argument("--snapshot-interval-s", type=float, default=30.0,
                     help="write a snapshot after a commit this often (default 30)")
    srv.add_argument("--snapshot-batches", type=int, default=1000,
                     help="... or after this many batches, whichever comes first "
                     "(default 1000)")
    srv.add_argument("--no-snapshot", action="store_true", help="keep no snapshot: every "
                     "start rebuilds from the whole log")
    srv.add_argument("--command-pubkey", type=input_file, help="decide's public key: commands are "
                     "folded only when it verifies them (default "
                     "$TRAINGUARD_COMMAND_PUBKEY_FILE, else $TRAINGUARD_COMMAND_PUBKEY)")
    srv.add_argument("--actuator-pubkeys", type=input_file, help="trusted actuator public keys: "
                     "outcomes and pool events are folded only when one verifies them "
                     "(default $TRAINGUARD_ACTUATOR_PUBKEYS_FILE, else "
                     "$TRAINGUARD_ACTUATOR_PUBKEYS)")
    srv.add_argument("--http-port", type=int, default=0, help="serve the incident list and "
                     "each timeline page (/incidents/<id>) over HTTP, read-only, live from the "
                     "fold, on this port (default 0: no HTTP server)")
    srv.add_argument("--http-addr", default="127.0.0.1", help="address of the HTTP pages "
                     "(default 127.0.0.1: this host only)")
    srv.set_defaults(func=_serve)


def _log_args(p: argparse.ArgumentParser) -> None:
    add_kafka_args(p)
    p.add_argument("--log", type=input_file, help="an exported JSON-lines log instead of the "
                   "topics (`trainguard replay export`)")
    renamed(p, p.add_argument("--job-id", help="only this job"), "--job")
    _settings_args(p)


def _settings_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--join-window-ms", type=int, default=30_000,
                   help="a verdict this soon after an incident opened joins it")
    p.add_argument("--lateness-ms", type=int, default=15_000,
                   help="event-time lateness of the live reorder buffer")


def settings_of(args: argparse.Namespace) -> IncidentSettings:
    return IncidentSettings(join_window_us=args.join_window_ms * 1000,
                            lateness_us=args.lateness_ms * 1000)


def load_log(args: argparse.Namespace) -> list[Event]:
    if args.log is not None:
        return read_log_file(args.log)
    cfg = kafka_config(args, client_id="trainguard-incident")
    return asyncio.run(read_topics(cfg)).events


def _list(args: argparse.Namespace) -> int:
    views = incident_views(load_log(args), settings_of(args), args.job_id)
    for v in views:
        inc = v.incident
        tier = f" tier {inc.tier}" if inc.tier is not None else ""
        took = f"{(inc.closed_at - inc.opened_at) / 1e6:.3f}s" if inc.closed_at else "open"
        kinds = ",".join(sorted({r.kind for r in inc.verdicts.values()}))
        where = ", ".join(f"{k} {x}" for k, x in inc.subject.model_dump(exclude_none=True).items())
        state = inc.state.value if inc.state else "?"
        print(f"{inc.incident_id[:12]}  {inc.job_id}  {to_iso(inc.opened_at)}  "
              f"{state + tier:<16} {took:>9}  {kinds}  at {where or 'the job'}  [{v.status}]")
    print(f"{len(views)} incident(s)")
    return 0


def _show(args: argparse.Namespace) -> int:
    events = load_log(args)  # a bad log or no broker: one line and exit 2, from cli.main
    view = find(incident_views(events, settings_of(args), args.job_id), args.id)
    text = render(build_timeline(view.incident, events), args.format)
    if args.out:
        args.out.write_text(text)
        print(f"wrote {args.out} ({args.format}, incident {view.incident.incident_id})")
    else:
        sys.stdout.write(text)
    return 0


def snapshots_of(args: argparse.Namespace, prefix: str) -> Snapshots | None:
    if args.no_snapshot:
        return None
    if not args.snapshot_interval_s > 0:
        raise CliError(f"--snapshot-interval-s {args.snapshot_interval_s}: must be > 0")
    if args.snapshot_batches < 1:
        raise CliError(f"--snapshot-batches {args.snapshot_batches}: must be >= 1")
    group = args.group_id or f"{prefix}-incidents"  # serve()'s default group
    directory = args.state_dir or state_dir() / f"incidents-{group}"
    return Snapshots(SnapshotStore(directory), interval_s=args.snapshot_interval_s,
                     every_batches=args.snapshot_batches)


def _serve(args: argparse.Namespace) -> int:
    from trainguard.actuators import signing

    try:
        trust = signing.Trust(
            decide=signing.load_command_pubkey(key_file=args.command_pubkey),
            actuators=signing.load_actuator_pubkeys(key_file=args.actuator_pubkeys))
    except signing.SigningKeyError as exc:
        raise SystemExit(f"trainguard incident serve: {exc}") from None
    if not 0 <= args.http_port < 65536:
        raise CliError(f"--http-port {args.http_port}: must be 0 (no HTTP server) to 65535")
    cfg = kafka_config(args, client_id="trainguard-incidents")
    settings = settings_of(args)
    snapshots = snapshots_of(args, cfg.topic_prefix)

    async def run(stop: asyncio.Event) -> None:
        bus = KafkaBus(cfg)
        live = LiveIncidents(settings)
        context = EventContext()
        web_runner = feed = None
        if args.http_port:
            from trainguard.incidents import webserver

            try:
                web_runner = await webserver.start(webserver.LiveSource(live, context),
                                                   args.http_addr, args.http_port)
            except webserver.WebError as exc:
                raise CliError(str(exc)) from None
            print(f"incidents: serving http://{args.http_addr}:{args.http_port}/", flush=True)
            feed = asyncio.create_task(webserver.follow_context(bus, context, stop))
        try:
            stats = await serve(bus, settings=settings, group=args.group_id,
                                idle_flush_s=args.idle_flush_s, stop=stop, check=trust.check,
                                live=live, observe=context.add if args.http_port else None,
                                snapshots=snapshots)
        finally:
            stop.set()
            if feed is not None:
                await asyncio.gather(feed, return_exceptions=True)
            if web_runner is not None:
                await web_runner.cleanup()
        print(f"incidents: consumed {stats.consumed}, published {stats.published}, "
              f"already published {stats.already_published}")

    run_until_stopped(run)
    return 0
