"""Job-wide slowdown and pipeline-stage imbalance: the slowness that is not one rank's.

``JobSlowdownRule``: the job's median compute time per closed step, averaged over a rolling
window, against the job's own baseline (the mean of its first ``baseline_steps`` step medians);
flagged when the ratio exceeds ``threshold_ratio`` in ``k`` of the last ``n`` windows *and* at
least ``min_rank_fraction`` of the ranks are individually over it: one job-level verdict
instead of one straggler per rank (the straggler rule compares with peers and stays quiet).
It opens once that has held for ``min_span_ms`` of event time: windows count steps, and a job
of 3 ms steps had 5 windows over in 0.15 s (the slurm-head-partition drill, 2026-12-07: a
1.7x hiccup while every agent drained its spool on the same two cores), no slowdown to report.

``StageImbalanceRule``: a pipeline stage whose windowed median stands above the median of the
other stages' is a stage slower by design (an uneven layer split), reported as ``info`` at the
job with the stage as ``unit``, not as a faulty node.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import CheckpointAction, CheckpointEvent, StepReport, VerdictKind
from trainguard.rules import steps
from trainguard.rules.base import Context, RuleBase, num
from trainguard.rules.stats import median
from trainguard.rules.steps import Flag, StepGroup, flags_doc, flags_from_doc
from trainguard.rules.straggler import stage_of


@dataclass(slots=True)
class Baseline:
    """The job's baseline so far: the sum and count of its first step medians (JSON: ``[total,
    count]``)."""

    total: float = 0.0
    count: int = 0

    def doc(self) -> list[Any]:
        return [self.total, self.count]


@dataclass(slots=True)
class JobSlowdownState:
    """JSON via ``doc``/``from_doc``, one key per field."""

    group: StepGroup = field(default_factory=StepGroup)  # the job's step alignment
    hist: dict[str, list[float]] = field(default_factory=dict)  # rank or "*" -> its window
    flags: dict[str, list[Flag]] = field(default_factory=dict)  # "*" -> the last n windows
    base: Baseline = field(default_factory=Baseline)
    calm: int = 0  # windows back to normal while open
    since: int = -1  # when k of the last n windows first were over, this time (-1: they are not)

    def doc(self) -> dict[str, Any]:
        return {"group": self.group.doc(), "hist": self.hist, "flags": flags_doc(self.flags),
                "base": self.base.doc(), "calm": self.calm, "since": self.since}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> JobSlowdownState:
        """Keys missing (an older layout) take their initial values."""
        base = doc.get("base", [0.0, 0])
        return cls(group=StepGroup.from_doc(doc["group"]) if "group" in doc else StepGroup(),
                   hist=_hist(doc.get("hist", {})), flags=flags_from_doc(doc.get("flags", {})),
                   base=Baseline(float(base[0]), int(base[1])), calm=int(doc.get("calm", 0)),
                   since=int(doc.get("since", -1)))


@dataclass(slots=True)
class StageImbalanceState:
    """JSON via ``doc``/``from_doc``, one key per field."""

    groups: dict[str, StepGroup] = field(default_factory=dict)  # stage -> its step alignment
    hist: dict[str, list[float]] = field(default_factory=dict)  # stage -> window of medians
    latest: dict[str, float] = field(default_factory=dict)  # stage -> its last window mean
    flags: dict[str, list[Flag]] = field(default_factory=dict)  # stage -> the last n windows
    calm: dict[str, int] = field(default_factory=dict)  # stage -> windows back to normal

    def doc(self) -> dict[str, Any]:
        return {"groups": {g: group.doc() for g, group in self.groups.items()},
                "hist": self.hist, "latest": self.latest, "flags": flags_doc(self.flags),
                "calm": self.calm}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> StageImbalanceState:
        """Keys missing (an older layout) take their initial values."""
        return cls(groups={str(g): StepGroup.from_doc(d)
                           for g, d in doc.get("groups", {}).items()},
                   hist=_hist(doc.get("hist", {})),
                   latest={str(g): float(m) for g, m in doc.get("latest", {}).items()},
                   flags=flags_from_doc(doc.get("flags", {})),
                   calm={str(g): int(n) for g, n in doc.get("calm", {}).items()})


def _hist(doc: dict[str, Any]) -> dict[str, list[float]]:
    return {str(k): [float(x) for x in ring] for k, ring in doc.items()}


def _checkpoint(event: Event, groups: list[StepGroup]) -> bool:
    """A checkpoint event: a LOADED one restarts the step count of every group."""
    payload = event.payload
    if type(payload) is not CheckpointEvent:
        return False
    if payload.action is CheckpointAction.LOADED:
        for group in groups:
            steps.reset(group)
    return True


class JobSlowdownRule(RuleBase):
    kinds = frozenset({VerdictKind.JOB_SLOWDOWN})
    types = frozenset({"step.report", "checkpoint"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.st = JobSlowdownState()

    def state_doc(self) -> dict[str, Any]:
        return self.st.doc()

    def load_state(self, doc: dict[str, Any]) -> None:
        self.st = JobSlowdownState.from_doc(doc)

    def rebind(self, rank: str, event: Event) -> list[Event]:
        self.st.hist.pop(rank, None)  # a new replica's window starts afresh
        return []

    def feed(self, event: Event) -> list[Event]:
        if _checkpoint(event, [self.st.group]):
            return []
        rep = cast(StepReport, event.payload)
        closed = steps.add(self.st.group, str(rep.rank), rep.step, rep.compute_ms,
                           event.event_time, int(self.p["close_lag_steps"]))
        out: list[Event] = []
        for step, row in closed:
            out.extend(self._judge(step, row))
        return out

    def _judge(self, step: int, row: dict[str, steps.Cell]) -> list[Event]:
        p, s = self.p, self.st
        size = int(p["window_steps"])
        time = max(int(v.time) for v in row.values())
        med = median([v.value for v in row.values()])
        base = s.base
        if base.count < int(p["baseline_steps"]):
            base.total += med
            base.count += 1
            for rank, v in row.items():
                steps.push_window(s.hist, rank, v.value, size)
            steps.push_window(s.hist, "*", med, size)
            return []
        baseline = base.total / base.count
        job_mean = steps.push_window(s.hist, "*", med, size)
        rank_means = [m for rank in sorted(row)
                      if (m := steps.push_window(s.hist, rank, row[rank].value, size))
                      is not None]
        if job_mean is None or baseline <= 0 or not rank_means:
            return []
        ratio = job_mean / baseline
        slow = sum(1 for m in rank_means if m > p["threshold_ratio"] * baseline)
        fraction = slow / len(rank_means)
        over = ratio > p["threshold_ratio"] and fraction >= p["min_rank_fraction"]
        flags = steps.push_flag(s.flags, "*", Flag(over, time, step), int(p["n"]))
        evidence = {"job_median_ms": num(job_mean), "baseline_ms": num(baseline),
                    "ratio": num(ratio), "slow_rank_fraction": num(fraction),
                    "ranks": len(rank_means), "windows_over": sum(1 for f in flags if f.over),
                    "windows": len(flags), "window_steps": size, "step": step}
        if not self.book.is_open("job"):
            hits = [f for f in flags if f.over]
            if len(hits) < int(p["k"]):
                s.since = -1
                return []
            if s.since < 0:
                s.since = hits[0].time
            if time - s.since < int(p["min_span_ms"]) * 1000:
                return []  # a hiccup of a job of short steps: not yet a slowdown
            s.calm, first, s.since = 0, s.since, -1
            return self.book.raise_("job", kind=VerdictKind.JOB_SLOWDOWN, subject=Subject(),
                                    severity=None, first_time=first, decided_time=time,
                                    evidence=evidence)
        s.calm = s.calm + 1 if ratio < p["resolve_ratio"] else 0
        if s.calm >= int(p["resolve_windows"]):
            s.flags["*"] = []
            return self.book.resolve("job", decided_time=time, evidence=evidence)
        return []


class StageImbalanceRule(RuleBase):
    kinds = frozenset({VerdictKind.STAGE_IMBALANCE})
    types = frozenset({"step.report", "checkpoint"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.st = StageImbalanceState()

    def state_doc(self) -> dict[str, Any]:
        return self.st.doc()

    def load_state(self, doc: dict[str, Any]) -> None:
        self.st = StageImbalanceState.from_doc(doc)

    def feed(self, event: Event) -> list[Event]:
        if _checkpoint(event, list(self.st.groups.values())):
            return []
        rep = cast(StepReport, event.payload)
        if rep.pp_stage is None:
            return []
        stage = stage_of(rep)
        group = self.st.groups.get(stage)
        if group is None:
            group = self.st.groups[stage] = StepGroup()
        out: list[Event] = []
        for step, row in steps.add(group, str(rep.rank), rep.step, rep.compute_ms,
                                   event.event_time, int(self.p["close_lag_steps"])):
            out.extend(self._judge(stage, step, row))
        return out

    def _judge(self, stage: str, step: int, row: dict[str, steps.Cell]) -> list[Event]:
        p, s = self.p, self.st
        size = int(p["window_steps"])
        time = max(int(v.time) for v in row.values())
        mean = steps.push_window(s.hist, stage, median([v.value for v in row.values()]), size)
        if mean is None:
            return []
        s.latest[stage] = mean
        others = [m for st, m in sorted(s.latest.items()) if st != stage]
        if len(others) + 1 < int(p["min_stages"]):
            return []
        ref = median(others)
        if ref <= 0:
            return []
        ratio = mean / ref
        flags = steps.push_flag(s.flags, stage, Flag(ratio > p["threshold_ratio"], time, step),
                                int(p["n"]))
        key = f"stage:{stage}"
        evidence = {"pp_stage": stage, "stage_median_ms": num(mean),
                    "other_stages_median_ms": num(ref), "ratio": num(ratio),
                    "stages": len(others) + 1, "windows_over": sum(1 for f in flags if f.over),
                    "windows": len(flags), "window_steps": size, "step": step}
        if not self.book.is_open(key):
            hits = [f for f in flags if f.over]
            if len(hits) >= int(p["k"]):
                s.calm[stage] = 0
                return self.book.raise_(key, kind=VerdictKind.STAGE_IMBALANCE,
                                        subject=Subject(unit=f"pp_stage:{stage}"),
                                        severity=None, first_time=hits[0].time,
                                        decided_time=time, evidence=evidence)
            return []
        calm = s.calm[stage] = s.calm.get(stage, 0) + 1 if ratio < p["resolve_ratio"] else 0
        if calm >= int(p["resolve_windows"]):
            s.flags[stage] = []
            return self.book.resolve(key, decided_time=time, evidence=evidence)
        return []
