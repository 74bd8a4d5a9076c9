"""Score a rule set on the labelled cases: precision, recall and time-to-verdict per case.

An opened verdict of a scored kind is a true positive when an expectation of the case names its
kind and rank and its onset lies in the expected window; otherwise it is a false positive (a
verdict that reopens for the same fault still counts as true). Recall: the share of expectations
met by at least one verdict. Time-to-verdict: steps from the fault's true onset to the step at
which the first matching verdict was decided (inclusive).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from trainguard.events.payloads import Verdict, VerdictState
from trainguard.quality.cases import Case, Expect, sorted_events
from trainguard.rules import RuleSet, replay


@dataclass(frozen=True)
class CaseScore:
    case: Case
    opened: int  # verdicts of the scored kinds opened
    true_pos: int
    expected: int
    found: int  # expectations met
    ttv: tuple[int, ...]  # time-to-verdict of each met expectation, in the case's unit
    false: tuple[str, ...]  # "kind rank@onset" of each false positive
    rank_steps: int
    seconds: float

    @property
    def precision(self) -> float:
        return self.true_pos / self.opened if self.opened else 1.0

    @property
    def recall(self) -> float:
        return self.found / self.expected if self.expected else 1.0


@dataclass(frozen=True)
class Totals:
    opened: int
    true_pos: int
    expected: int
    found: int

    @property
    def precision(self) -> float:
        return self.true_pos / self.opened if self.opened else 1.0

    @property
    def recall(self) -> float:
        return self.found / self.expected if self.expected else 1.0


def _matches(e: Expect, kind: str, rank: int | None, node: str | None, onset: int) -> bool:
    return e.kind == kind and e.rank == rank and e.onset_lo <= onset <= e.onset_hi \
        and (e.node is None or e.node == node)


def score_case(case: Case, rules: RuleSet) -> CaseScore:
    events = sorted_events(case)
    t0 = time.perf_counter()
    out = replay(events, rules, events[0].job_id if events else case.name)
    seconds = time.perf_counter() - t0
    opened = tp = 0
    first: dict[int, int] = {}  # expectation index -> decided step of its first verdict
    false: list[str] = []
    for ev in out:
        v = ev.payload
        if not isinstance(v, Verdict) or v.state is not VerdictState.OPEN \
                or v.kind not in case.kinds:
            continue
        opened += 1
        onset = case.step_of(v.first_anomalous_time)
        hit = [i for i, e in enumerate(case.expect)
               if _matches(e, v.kind, ev.subject.rank, ev.subject.node, onset)]
        if hit:
            tp += 1
            for i in hit:
                first.setdefault(i, case.step_of(v.decided_time))
        else:
            where = ev.subject.rank if ev.subject.rank is not None else \
                (ev.subject.node or "job")
            false.append(f"{v.kind} {where}@{onset}")
    ttv = tuple(first[i] - case.expect[i].true_onset + 1 for i in sorted(first))
    return CaseScore(case, opened, tp, len(case.expect), len(first), ttv, tuple(false),
                     len(events), seconds)


def score_suite(cases: Iterable[Case], rules: RuleSet) -> tuple[list[CaseScore], Totals]:
    scores = [score_case(c, rules) for c in cases]
    totals = Totals(sum(s.opened for s in scores), sum(s.true_pos for s in scores),
                    sum(s.expected for s in scores), sum(s.found for s in scores))
    return scores, totals


def render_table(scores: list[CaseScore], totals: Totals) -> str:
    head = (f"{'case':<20} {'exp':>3} {'open':>4} {'TP':>3} {'P':>5} {'R':>5} "
            f"{'ttv':>9} {'rank-steps':>10} {'s':>5}  false positives / note")
    lines = [head, "-" * len(head)]
    for s in scores:
        ttv = ",".join(str(t) for t in s.ttv) or "-"
        if len(s.ttv) > 3:
            ttv = f"max {max(s.ttv)}"
        what = "; ".join(s.false[:4]) + (f" (+{len(s.false) - 4})" if len(s.false) > 4 else "")
        lines.append(f"{s.case.name:<20} {s.expected:>3} {s.opened:>4} {s.true_pos:>3} "
                     f"{s.precision:>5.2f} {s.recall:>5.2f} {ttv:>9} {s.rank_steps:>10} "
                     f"{s.seconds:>5.1f}  {what or s.case.note}")
    lines.append("-" * len(head))
    lines.append(f"{'overall':<20} {totals.expected:>3} {totals.opened:>4} "
                 f"{totals.true_pos:>3} {totals.precision:>5.3f} {totals.recall:>5.3f}")
    return "\n".join(lines)
