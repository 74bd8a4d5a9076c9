"""`trainguard drill list|run|verify|report`: fault drills on the whole local loop, their
evidence and conclusions (runbook: docs/drills.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainguard.cli.flags import renamed


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("drill", help="fault drills: run scenarios, verify and report them")
    d = p.add_subparsers(dest="drill_command", required=True)
    ls = d.add_parser("list", help="the built-in scenarios")
    ls.set_defaults(func=_list)
    run = d.add_parser("run", help="run scenarios for real on the local loop")
    run.add_argument("scenarios", nargs="+", metavar="SCENARIO",
                     help="a built-in name, a YAML file, round:N or all")
    renamed(run, run.add_argument("--runs-dir", type=Path, help="where runs go (default "
                                  "$TRAINGUARD_STATE/drills)"), "--root")
    run.add_argument("--sign-off", default="unsigned", help="who signs the drill off")
    run.set_defaults(func=_run)
    ver = d.add_parser("verify", help="recompute every conclusion of a run from its recorded "
                       "log and archives, and compare")
    ver.add_argument("run", metavar="RUN", help="a run id or directory")
    renamed(ver, ver.add_argument("--runs-dir", type=Path, help="where to look for a run id "
                                  "(default $TRAINGUARD_STATE/drills)"), "--root")
    ver.set_defaults(func=_verify)
    rep = d.add_parser("report", help="write Markdown and HTML reports of a run")
    rep.add_argument("run", metavar="RUN", help="a run id or directory")
    renamed(rep, rep.add_argument("--runs-dir", type=Path, help="where to look for a run id "
                                  "(default $TRAINGUARD_STATE/drills)"), "--root")
    rep.set_defaults(func=_report)


def _list(args: argparse.Namespace) -> int:
    from trainguard.drills.scenario import ScenarioError, builtin_scenarios

    try:
        scenarios = builtin_scenarios()
    except ScenarioError as exc:
        print(f"trainguard drill: {exc}", file=sys.stderr)
        return 2
    for s in scenarios:
        print(f"round {s.round}  {s.name:22} {s.fault.kind:22} {s.fault.target or '-':10} "
              f"{s.title}")
    return 0


def _run_dir(args: argparse.Namespace) -> Path:
    from trainguard.drills.runner import runs_root

    p = Path(args.run)
    if p.is_dir():
        _check_meta(p / "run.json")
        return p
    found = Path(args.runs_dir or runs_root()) / str(args.run)
    if not found.is_dir():
        raise SystemExit(f"trainguard drill: no run {args.run!r} (looked in {found.parent})")
    _check_meta(found / "run.json")
    return found


def _check_meta(path: Path) -> None:
    """The run's ``run.json``: what verify and report read before anything else."""
    from trainguard.cli.common import CliError
    from trainguard.configfile import read_text, show

    try:
        meta = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise CliError(f"{path}: not JSON: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("run_id"), str):
        raise CliError(f"{path}: field 'run_id': a string (got {show(meta)})")
    scenarios = meta.get("scenarios")
    if not isinstance(scenarios, dict) or not all(isinstance(v, dict)
                                                  for v in scenarios.values()):
        raise CliError(f"{path}: field 'scenarios': a mapping of mappings "
                       f"(got {show(scenarios)})")


def _run(args: argparse.Namespace) -> int:
    from trainguard.drills.regression import changed_since_last
    from trainguard.drills.runner import run_drills, runs_root
    from trainguard.drills.scenario import ScenarioError, resolve

    try:
        scenarios = resolve(args.scenarios)
    except ScenarioError as exc:
        print(f"trainguard drill: {exc}", file=sys.stderr)
        return 2
    import signal

    def stop(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt  # the runner rolls back, stops the job and the stack

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    run_dir = run_drills(scenarios, root=args.runs_dir, signer=args.sign_off)
    print(f"[drill] run {run_dir.name}: {run_dir}")
    meta = json.loads((run_dir / "run.json").read_text())
    for name, s in meta["scenarios"].items():
        print(f"  {name:22} {s['conclusion'] or 'not run: ' + s.get('not_run', '')}")
    for line in changed_since_last(args.runs_dir or runs_root(), run_dir):
        print(f"[drill] {line}")
    print(f"[drill] next: trainguard drill verify {run_dir.name}; "
          f"trainguard drill report {run_dir.name}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from trainguard.drills.verify import verify_run

    run_dir = _run_dir(args)
    same = True
    for line, ok in verify_run(run_dir):
        print(line)
        same &= ok
    print("[drill] every conclusion reproduced" if same else
          "[drill] conclusions differ from the recorded ones")
    return 0 if same else 1


def _report(args: argparse.Namespace) -> int:
    from trainguard.drills.report import write_reports

    run_dir = _run_dir(args)
    for path in write_reports(run_dir):
        print(path)
    return 0
