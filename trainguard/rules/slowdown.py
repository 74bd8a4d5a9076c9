"""Job-wide slowdown and pipeline-stage imbalance: the slowness that is not one rank's.

``JobSlowdownRule``: the job's median compute time per closed step, averaged over a rolling
window, against the job's own baseline (the mean of its first ``baseline_steps`` step medians);
flagged when the ratio exceeds ``threshold_ratio`` in ``k`` of the last ``n`` windows *and* at
least ``min_rank_fraction`` of the ranks are individually over it: one job-level verdict
instead of one straggler per rank (the straggler rule compares with peers and stays quiet).

``StageImbalanceRule``: a pipeline stage whose windowed median stands above the median of the
other stages' is a stage slower by design (an uneven layer split), reported as ``info`` at the
job with the stage as ``unit``, not as a faulty node.
"""

from __future__ import annotations

from typing import Any, cast

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import CheckpointAction, CheckpointEvent, StepReport, VerdictKind
from trainguard.rules import steps
from trainguard.rules.base import RuleBase, num
from trainguard.rules.stats import median
from trainguard.rules.straggler import stage_of


def _checkpoint(event: Event, groups: list[steps.StepGroup]) -> bool:
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

    def initial_state(self) -> dict[str, Any]:
        return {"group": steps.new_group(), "hist": {}, "flags": {}, "base": [0.0, 0],
                "calm": 0}

    def snapshot(self) -> dict[str, Any]:
        return {"state": {**self.s, "group": self.s["group"].doc()}, "open": self.book.doc()}

    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        self.s["group"] = steps.StepGroup.from_doc(self.s["group"])

    def rebind(self, rank: str, event: Event) -> list[Event]:
        self.s["hist"].pop(rank, None)  # a new replica's window starts afresh
        return []

    def feed(self, event: Event) -> list[Event]:
        if _checkpoint(event, [self.s["group"]]):
            return []
        rep = cast(StepReport, event.payload)
        closed = steps.add(self.s["group"], str(rep.rank), rep.step, rep.compute_ms,
                           event.event_time, int(self.p["close_lag_steps"]))
        out: list[Event] = []
        for step, row in closed:
            out.extend(self._judge(step, row))
        return out

    def _judge(self, step: int, row: dict[str, steps.Cell]) -> list[Event]:
        p, s = self.p, self.s
        size = int(p["window_steps"])
        time = max(int(v[1]) for v in row.values())
        med = median([v[0] for v in row.values()])
        base = s["base"]
        if base[1] < int(p["baseline_steps"]):
            base[0] += med
            base[1] += 1
            for rank, v in row.items():
                steps.push_window(s["hist"], rank, v[0], size)
            steps.push_window(s["hist"], "*", med, size)
            return []
        baseline = base[0] / base[1]
        job_mean = steps.push_window(s["hist"], "*", med, size)
        rank_means = [m for rank in sorted(row)
                      if (m := steps.push_window(s["hist"], rank, row[rank][0], size)) is not None]
        if job_mean is None or baseline <= 0 or not rank_means:
            return []
        ratio = job_mean / baseline
        slow = sum(1 for m in rank_means if m > p["threshold_ratio"] * baseline)
        fraction = slow / len(rank_means)
        over = ratio > p["threshold_ratio"] and fraction >= p["min_rank_fraction"]
        flags = steps.push_flag(s["flags"], "*", [over, time, step], int(p["n"]))
        evidence = {"job_median_ms": num(job_mean), "baseline_ms": num(baseline),
                    "ratio": num(ratio), "slow_rank_fraction": num(fraction),
                    "ranks": len(rank_means), "windows_over": sum(1 for f in flags if f[0]),
                    "windows": len(flags), "window_steps": size, "step": step}
        if not self.book.is_open("job"):
            hits = [f for f in flags if f[0]]
            if len(hits) >= int(p["k"]):
                s["calm"] = 0
                return self.book.raise_("job", kind=VerdictKind.JOB_SLOWDOWN, subject=Subject(),
                                        severity=None, first_time=int(hits[0][1]),
                                        decided_time=time, evidence=evidence)
            return []
        s["calm"] = s["calm"] + 1 if ratio < p["resolve_ratio"] else 0
        if s["calm"] >= int(p["resolve_windows"]):
            s["flags"]["*"] = []
            return self.book.resolve("job", decided_time=time, evidence=evidence)
        return []


class StageImbalanceRule(RuleBase):
    kinds = frozenset({VerdictKind.STAGE_IMBALANCE})
    types = frozenset({"step.report", "checkpoint"})

    def initial_state(self) -> dict[str, Any]:
        # groups: stage -> step group; hist: stage -> window of medians; latest: stage -> mean
        return {"groups": {}, "hist": {}, "latest": {}, "flags": {}, "calm": {}}

    def snapshot(self) -> dict[str, Any]:
        groups = {g: group.doc() for g, group in self.s["groups"].items()}
        return {"state": {**self.s, "groups": groups}, "open": self.book.doc()}

    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        self.s["groups"] = {g: steps.StepGroup.from_doc(d) for g, d in self.s["groups"].items()}

    def feed(self, event: Event) -> list[Event]:
        if _checkpoint(event, list(self.s["groups"].values())):
            return []
        rep = cast(StepReport, event.payload)
        if rep.pp_stage is None:
            return []
        stage = stage_of(rep)
        group = self.s["groups"].get(stage)
        if group is None:
            group = self.s["groups"][stage] = steps.new_group()
        out: list[Event] = []
        for step, row in steps.add(group, str(rep.rank), rep.step, rep.compute_ms,
                                   event.event_time, int(self.p["close_lag_steps"])):
            out.extend(self._judge(stage, step, row))
        return out

    def _judge(self, stage: str, step: int, row: dict[str, steps.Cell]) -> list[Event]:
        p, s = self.p, self.s
        size = int(p["window_steps"])
        time = max(int(v[1]) for v in row.values())
        mean = steps.push_window(s["hist"], stage, median([v[0] for v in row.values()]), size)
        if mean is None:
            return []
        s["latest"][stage] = mean
        others = [m for st, m in sorted(s["latest"].items()) if st != stage]
        if len(others) + 1 < int(p["min_stages"]):
            return []
        ref = median(others)
        if ref <= 0:
            return []
        ratio = mean / ref
        flags = steps.push_flag(s["flags"], stage, [ratio > p["threshold_ratio"], time, step],
                                int(p["n"]))
        key = f"stage:{stage}"
        evidence = {"pp_stage": stage, "stage_median_ms": num(mean),
                    "other_stages_median_ms": num(ref), "ratio": num(ratio),
                    "stages": len(others) + 1, "windows_over": sum(1 for f in flags if f[0]),
                    "windows": len(flags), "window_steps": size, "step": step}
        if not self.book.is_open(key):
            hits = [f for f in flags if f[0]]
            if len(hits) >= int(p["k"]):
                s["calm"][stage] = 0
                return self.book.raise_(key, kind=VerdictKind.STAGE_IMBALANCE,
                                        subject=Subject(unit=f"pp_stage:{stage}"),
                                        severity=None, first_time=int(hits[0][1]),
                                        decided_time=time, evidence=evidence)
            return []
        calm = s["calm"][stage] = s["calm"].get(stage, 0) + 1 if ratio < p["resolve_ratio"] else 0
        if calm >= int(p["resolve_windows"]):
            s["flags"][stage] = []
            return self.book.resolve(key, decided_time=time, evidence=evidence)
        return []
