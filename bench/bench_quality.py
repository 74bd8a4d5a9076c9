"""The labelled quality suite's score table under the default rules (also `trainguard score`).

    .venv/bin/python -m bench.bench_quality [RULES.yaml]
"""

from __future__ import annotations

import sys
from pathlib import Path

from trainguard.quality import all_cases, render_table, score_suite
from trainguard.rules import load_default_rules, load_rules


def main() -> None:
    rules = load_rules(Path(sys.argv[1])) if len(sys.argv) > 1 else load_default_rules()
    print(render_table(*score_suite(all_cases(), rules)))


if __name__ == "__main__":
    main()
