"""Training health: non-finite loss, and a sustained loss spike after a resume.

A NaN/Inf loss opens a verdict at once; it resolves after ``resolve_reports`` finite losses.
After a checkpoint LOADED, the next ``watch_steps`` steps' losses are compared with the median
of the last ``baseline_reports`` finite losses before the resume: ``sustain_reports``
consecutive losses above ``spike_ratio`` x that median open a warning. Both carry the last
checkpoint (step, path) seen before the anomaly, so the remediation knows where to go back to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    Severity,
    StepReport,
    VerdictKind,
)
from trainguard.rules.base import Context, RuleBase, num
from trainguard.rules.gpu_health import Run
from trainguard.rules.stats import median


class Checkpoint(NamedTuple):
    """The last checkpoint seen (JSON: ``[step, path]``)."""

    step: int
    path: str


class Resume(NamedTuple):
    """A resume being watched: its checkpoint step and the loss baseline before it (JSON:
    ``[step, base]``)."""

    step: int
    base: float


@dataclass(slots=True)
class TrainingState:
    """JSON via ``doc``/``from_doc``, one key per field; keys missing (an older layout) take
    their initial values."""

    ckpt: Checkpoint | None = None
    losses: list[float] = field(default_factory=list)  # the last finite losses (baseline)
    resume: Resume | None = None
    spike: Run = field(default_factory=lambda: Run(0, 0, 0))  # over / calm runs after a resume
    finite: int = 0  # finite losses since a non-finite one

    def doc(self) -> dict[str, Any]:
        return {"ckpt": None if self.ckpt is None else list(self.ckpt), "losses": self.losses,
                "resume": None if self.resume is None else list(self.resume),
                "spike": self.spike.doc(), "finite": self.finite}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> TrainingState:
        ck, resume = doc.get("ckpt"), doc.get("resume")
        return cls(ckpt=None if ck is None else Checkpoint(int(ck[0]), str(ck[1])),
                   losses=[float(x) for x in doc.get("losses", [])],
                   resume=None if resume is None else Resume(int(resume[0]), float(resume[1])),
                   spike=Run.from_doc(doc.get("spike", [0, 0, 0])),
                   finite=int(doc.get("finite", 0)))


class TrainingHealthRule(RuleBase):
    kinds = frozenset({VerdictKind.LOSS_NONFINITE, VerdictKind.LOSS_SPIKE_AFTER_RESUME})
    types = frozenset({"step.report", "checkpoint"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.st = TrainingState()

    def state_doc(self) -> dict[str, Any]:
        return self.st.doc()

    def load_state(self, doc: dict[str, Any]) -> None:
        self.st = TrainingState.from_doc(doc)

    def feed(self, event: Event) -> list[Event]:
        p, s = self.p, self.st
        t = event.event_time
        payload = event.payload
        if type(payload) is CheckpointEvent:
            ck = payload
            if ck.action is not CheckpointAction.CORRUPT:
                s.ckpt = Checkpoint(ck.step, ck.path)
            if ck.action is CheckpointAction.LOADED:
                base = median(s.losses) if s.losses else None
                s.resume = None if base is None else Resume(ck.step, base)
                s.spike = Run(0, 0, 0)
            return []
        rep = cast(StepReport, payload)
        loss = rep.loss
        if loss is None:
            return []
        last = s.ckpt
        where = {"last_checkpoint_step": None if last is None else last.step,
                 "last_checkpoint_path": None if last is None else last.path,
                 "step": rep.step, "rank": rep.rank}
        if not math.isfinite(loss):
            s.finite = 0
            return self.book.raise_("nonfinite", kind=VerdictKind.LOSS_NONFINITE,
                                    subject=Subject(rank=rep.rank), severity=None,
                                    first_time=t, decided_time=t,
                                    evidence={**where, "loss": str(loss)})
        out: list[Event] = []
        if self.book.is_open("nonfinite"):
            s.finite += 1
            if s.finite >= int(p["resolve_reports"]):
                out.extend(self.book.resolve("nonfinite", decided_time=t,
                                             evidence={**where, "loss": num(loss)}))
        resume = s.resume
        watching = resume is not None and rep.step <= resume.step + int(p["watch_steps"])
        if resume is not None and (watching or self.book.is_open("spike")):
            out.extend(self._spike(loss, resume.base, t, where))
        else:
            s.resume = None
            s.losses.append(loss)
            if len(s.losses) > int(p["baseline_reports"]):
                del s.losses[0]
        return out

    def _spike(self, loss: float, base: float, t: int, where: dict[str, Any]) -> list[Event]:
        p, run = self.p, self.st.spike  # bad: the over run, good: the calm run
        ratio = loss / base if base > 0 else math.inf
        ev = {**where, "loss": num(loss), "baseline_loss": num(base), "ratio": num(ratio)}
        if ratio > p["spike_ratio"]:
            if run.bad == 0:
                run.first = t
            run.bad += 1
            run.good = 0
            if run.bad >= int(p["sustain_reports"]):
                return self.book.raise_("spike", kind=VerdictKind.LOSS_SPIKE_AFTER_RESUME,
                                        subject=Subject(), severity=Severity.WARNING,
                                        first_time=run.first, decided_time=t, evidence=ev)
            return []
        run.bad = 0
        run.good += 1
        if run.good >= int(p["resolve_reports"]) and self.book.is_open("spike"):
            return self.book.resolve("spike", decided_time=t, evidence=ev)
        return []
