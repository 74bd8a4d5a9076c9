"""`trainguard score [--rules FILE] [--case NAME]...`: the labelled quality suite's table
(precision, recall, time-to-verdict per case and overall) under a rule set."""

from __future__ import annotations

import argparse

from trainguard.cli.common import input_file
from trainguard.quality import all_cases, render_table, score_suite
from trainguard.rules import load_default_rules, load_rules


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sp = sub.add_parser("score", help="score the rules on the labelled quality suite")
    sp.add_argument("--rules", type=input_file,
                    help="rule file (default: the shipped default rules)")
    sp.add_argument("--case", action="append", default=[], metavar="NAME",
                    help="only this case (repeatable; default: every case)")
    sp.set_defaults(func=_score)


def _score(args: argparse.Namespace) -> int:
    rules = load_rules(args.rules) if args.rules else load_default_rules()
    cases = all_cases()
    if args.case:
        names = {c.name for c in cases}
        unknown = [n for n in args.case if n not in names]
        if unknown:
            raise SystemExit(f"trainguard score: no case {unknown[0]!r} "
                             f"(cases: {', '.join(sorted(names))})")
        cases = [c for c in cases if c.name in args.case]
    scores, totals = score_suite(cases, rules)
    print(render_table(scores, totals))
    return 0
