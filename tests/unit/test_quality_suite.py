"""The labelled quality suite (trainguard/quality): the default rules' precision and recall on
it, and the scorer itself."""

from __future__ import annotations

import pytest

from trainguard.events.envelope import Event
from trainguard.quality import Case, Expect, all_cases, score_case, score_suite
from trainguard.rules import RuleSet, load_default_rules
from trainguard.rules.synth import job_steps

pytestmark = pytest.mark.unit
RULES = load_default_rules()


def test_the_suite_meets_its_targets() -> None:
    # the 16,384-rank case (~0.5M rank-steps) is scored on its own below
    scores, totals = score_suite([c for c in all_cases() if "large" not in c.tags], RULES)
    by = {s.case.name: s for s in scores}
    # the bar: CI fails below precision 0.99 and recall 0.99 over the whole suite
    assert totals.precision >= 0.99 and totals.recall >= 0.99, \
        [(s.case.name, s.precision, s.recall, s.false) for s in scores
         if (s.precision, s.recall) != (1.0, 1.0)]
    # today every case is exact: each expected verdict found at its onset and subject, no other
    for s in scores:
        assert (s.precision, s.recall) == (1.0, 1.0), (s.case.name, s.false)
    # the suite covers what the issue names: real traces, captured kernel logs, dcgm and
    # nvidia-smi captures, an external fault feed, and a 16,384-rank layout
    assert {"alibaba-3", "kmsg-oom-at-ranks", "dcgm-8xH100", "smi-csv-H200-mig",
            "fault-feed-overlap"} <= set(by)
    # time-to-verdict: a clean rank slowed 1.5x or more is flagged within 4 steps
    assert by["late-1.5x"].ttv == (4,) and by["late-2.0x"].ttv == (4,)
    assert by["big-2048"].ttv == (4,)


def test_the_16384_rank_layout() -> None:
    (case,) = [c for c in all_cases() if c.name == "huge-16384"]
    s = score_case(case, RULES)
    assert (s.opened, s.precision, s.recall, s.ttv) == (1, 1.0, 1.0, (4,)), s.false
    assert s.rank_steps == 16384 * 30


def test_the_scorer_counts_misses_and_false_verdicts() -> None:
    def events() -> list[Event]:
        return list(job_steps("j", 8, 100, noise=0.05, slow={3: (50, 2.0)}))

    right = Case("right", events, (Expect("straggler", 3, 49, 52, 50),))
    wrong_rank = Case("wrong", events, (Expect("straggler", 4, 49, 52, 50),))
    wrong_time = Case("late", events, (Expect("straggler", 3, 60, 70, 60),))
    s = score_case(right, RULES)
    assert (s.opened, s.true_pos, s.found, s.precision, s.recall) == (1, 1, 1, 1.0, 1.0)
    assert s.ttv == (4,)
    for case in (wrong_rank, wrong_time):
        s = score_case(case, RULES)
        assert (s.precision, s.recall) == (0.0, 0.0) and len(s.false) == 1
    silent = score_case(right, RuleSet((), RULES.allowed_lateness_us))
    assert (silent.opened, silent.precision, silent.recall) == (0, 1.0, 0.0)
