"""The labelled quality suite: cases with expected verdicts, and their score (precision, recall,
time-to-verdict) under a rule set. ``trainguard score`` prints the table."""

from trainguard.quality.cases import Case, Expect, all_cases
from trainguard.quality.score import CaseScore, Totals, render_table, score_case, score_suite

__all__ = ["Case", "CaseScore", "Expect", "Totals", "all_cases", "render_table", "score_case",
           "score_suite"]
