"""The labelled quality suite's score table (also `trainguard score`).

    .venv/bin/python -m bench.bench_quality [--rules RULES.yaml] [--legacy]

``--legacy``: the table for the straggler rule as it was before issue 14 as well, first.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.legacy import legacy_ruleset, legacy_straggler
from trainguard.quality import all_cases, render_table, score_suite
from trainguard.rules import load_default_rules, load_rules


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rules", type=Path)
    ap.add_argument("--legacy", action="store_true")
    args = ap.parse_args()
    rules = load_rules(args.rules) if args.rules else load_default_rules()
    if args.legacy:
        print("before (the straggler rule at d7da321, its old defaults):")
        with legacy_straggler():
            print(render_table(*score_suite(all_cases(), legacy_ruleset(rules))))
        print("\nafter:")
    print(render_table(*score_suite(all_cases(), rules)))


if __name__ == "__main__":
    main()
