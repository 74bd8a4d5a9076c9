"""Training health: non-finite loss, and a sustained loss spike after a resume.

A NaN/Inf loss opens a verdict at once; it resolves after ``resolve_reports`` finite losses.
After a checkpoint LOADED, the next ``watch_steps`` steps' losses are compared with the median
of the last ``baseline_reports`` finite losses before the resume: ``sustain_reports``
consecutive losses above ``spike_ratio`` x that median open a warning. Both carry the last
checkpoint (step, path) seen before the anomaly, so the remediation knows where to go back to.
"""

from __future__ import annotations

import math
from typing import Any, cast

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    Severity,
    StepReport,
    VerdictKind,
)
from trainguard.rules.base import RuleBase, num
from trainguard.rules.stats import median


class TrainingHealthRule(RuleBase):
    kinds = frozenset({VerdictKind.LOSS_NONFINITE, VerdictKind.LOSS_SPIKE_AFTER_RESUME})
    types = frozenset({"step.report", "checkpoint"})

    def initial_state(self) -> dict[str, Any]:
        return {"ckpt": None, "losses": [], "resume": None, "spike": [0, 0, 0],
                "finite": 0}

    def feed(self, event: Event) -> list[Event]:
        p, s = self.p, self.s
        t = event.event_time
        payload = event.payload
        if type(payload) is CheckpointEvent:
            ck = payload
            if ck.action is not CheckpointAction.CORRUPT:
                s["ckpt"] = [ck.step, ck.path]
            if ck.action is CheckpointAction.LOADED:
                base = median(s["losses"]) if s["losses"] else None
                s["resume"] = None if base is None else [ck.step, base]
                s["spike"] = [0, 0, 0]
            return []
        rep = cast(StepReport, payload)
        loss = rep.loss
        if loss is None:
            return []
        ck = s["ckpt"]
        where = {"last_checkpoint_step": None if ck is None else ck[0],
                 "last_checkpoint_path": None if ck is None else ck[1],
                 "step": rep.step, "rank": rep.rank}
        if not math.isfinite(loss):
            s["finite"] = 0
            return self.book.raise_("nonfinite", kind=VerdictKind.LOSS_NONFINITE,
                                    subject=Subject(rank=rep.rank), severity=None,
                                    first_time=t, decided_time=t,
                                    evidence={**where, "loss": str(loss)})
        out: list[Event] = []
        if self.book.is_open("nonfinite"):
            s["finite"] += 1
            if s["finite"] >= int(p["resolve_reports"]):
                out.extend(self.book.resolve("nonfinite", decided_time=t,
                                             evidence={**where, "loss": num(loss)}))
        resume = s["resume"]
        watching = resume is not None and rep.step <= resume[0] + int(p["watch_steps"])
        if watching or (resume is not None and self.book.is_open("spike")):
            out.extend(self._spike(loss, resume[1], t, where))
        else:
            s["resume"] = None
            s["losses"].append(loss)
            if len(s["losses"]) > int(p["baseline_reports"]):
                del s["losses"][0]
        return out

    def _spike(self, loss: float, base: float, t: int, where: dict[str, Any]) -> list[Event]:
        p, run = self.p, self.s["spike"]  # [over run, calm run, first over time]
        ratio = loss / base if base > 0 else math.inf
        ev = {**where, "loss": num(loss), "baseline_loss": num(base), "ratio": num(ratio)}
        if ratio > p["spike_ratio"]:
            if run[0] == 0:
                run[2] = t
            run[0] += 1
            run[1] = 0
            if run[0] >= int(p["sustain_reports"]):
                return self.book.raise_("spike", kind=VerdictKind.LOSS_SPIKE_AFTER_RESUME,
                                        subject=Subject(), severity=Severity.WARNING,
                                        first_time=run[2], decided_time=t, evidence=ev)
            return []
        run[0] = 0
        run[1] += 1
        if run[1] >= int(p["resolve_reports"]) and self.book.is_open("spike"):
            return self.book.resolve("spike", decided_time=t, evidence=ev)
        return []
