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


def test_the_suite_scores_what_the_rules_reach() -> None:
    scores, totals = score_suite(all_cases(), RULES)
    by = {s.case.name: s for s in scores}
    # every synthetic trap exactly right: each expected verdict found at its onset, no other
    for s in scores:
        if "real" not in s.case.tags:
            assert (s.precision, s.recall) == (1.0, 1.0), (s.case.name, s.false)
    # the real traces: every labelled straggler found; one verdict beyond the labels (Alibaba
    # job 3, worker 9, slowed like the labelled worker 8: see test_rules_alibaba)
    assert all(s.recall == 1.0 for s in scores)
    assert by["alibaba-3"].false == ("straggler 9@2271",)
    assert totals.recall == 1.0 and totals.precision >= 0.93  # the target is 0.99: see above
    # time-to-verdict: a clean rank slowed 1.5x or more is flagged within 4 steps
    assert by["late-1.5x"].ttv == (4,) and by["late-2.0x"].ttv == (4,)
    assert by["big-2048"].ttv == (4,)


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
