"""Every check over one scenario's recorded log, and the conclusion. Pure: the same inputs
give the same evaluation (``trainguard drill verify`` recomputes it and compares)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainguard.drills.evidence import progress, resources, results
from trainguard.drills.evidence.conclusion import conclude
from trainguard.drills.evidence.expectations import expectations
from trainguard.drills.evidence.log import index
from trainguard.drills.evidence.model import Artifacts, Baseline, Check, Conclusion
from trainguard.drills.evidence.slurm import slurm_checks
from trainguard.drills.evidence.timings import timings
from trainguard.drills.scenario import Expect
from trainguard.events.envelope import Event
from trainguard.events.payloads import Command, CommandAction, IncidentTransition


@dataclass(frozen=True)
class EvidenceInput:
    job_id: str
    events: Sequence[Event]
    expect: Expect
    loss_tolerance: float
    settle_steps: int
    baseline: Baseline | None
    artifacts: Artifacts | None
    lost_node: str | None = None  # a node the fault took away (node loss)
    slurm: Mapping[str, Any] | None = None  # Slurm's view of the lost node's steps (cluster)


@dataclass(frozen=True)
class Evaluation:
    conclusion: Conclusion
    reasons: tuple[str, ...]
    checks: tuple[Check, ...]
    expectations: tuple[Check, ...]
    timings: Mapping[str, float | int | None]

    def to_dict(self) -> dict[str, Any]:
        return {"conclusion": self.conclusion.value, "reasons": list(self.reasons),
                "checks": [c.to_dict() for c in self.checks],
                "expectations": [c.to_dict() for c in self.expectations],
                "timings": dict(self.timings)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Evaluation:
        return Evaluation(conclusion=Conclusion(d["conclusion"]),
                          reasons=tuple(d.get("reasons", ())),
                          checks=tuple(Check.from_dict(c) for c in d.get("checks", ())),
                          expectations=tuple(Check.from_dict(c)
                                             for c in d.get("expectations", ())),
                          timings=dict(d.get("timings", {})))


def evaluate(inp: EvidenceInput) -> Evaluation:
    log = index(inp.events, inp.job_id)
    checks = [
        progress.resumed_from_last_valid(log, inp.expect.resumed),
        progress.no_step_skipped(log),
        progress.no_step_repeated_beyond_checkpoint(log),
        progress.not_restarted_from_zero(log),
        progress.no_data_consumed_twice(log),
        progress.progressed_after_fault(log, inp.settle_steps),
        resources.old_stopped_before_new(log),
        resources.no_duplicate_replica(log, inp.artifacts),
        resources.old_resources_released(log, inp.artifacts),
        resources.binding_kept_quota_and_permissions(log, inp.artifacts),
        results.loss_within_tolerance(log, inp.baseline, inp.loss_tolerance),
        results.checkpoint_files_intact(log, inp.artifacts),
    ]
    if inp.slurm is not None:
        checks += slurm_checks(inp.slurm, log)
    exp = expectations(log, inp.expect, inp.lost_node)
    fault = log.fault_start() or 0
    escalated = any(isinstance(e.payload, Command) and e.payload.action is CommandAction.ESCALATE
                    and e.event_time >= fault for e in log.commands) or any(
        isinstance(e.payload, IncidentTransition) and e.payload.to_state.value == "escalated"
        and e.event_time >= fault for e in log.incidents)
    no_valid = inp.artifacts is not None and inp.artifacts.collected and not any(
        c.valid and not c.quarantined for c in inp.artifacts.checkpoints)
    unrecoverable = no_valid or any(
        isinstance(e.payload, IncidentTransition) and e.payload.to_state.value == "unrecoverable"
        and e.event_time >= fault for e in log.incidents)
    conclusion, reasons = conclude(checks, exp, escalated=escalated,
                                   unrecoverable=unrecoverable)
    return Evaluation(conclusion, tuple(reasons), tuple(checks), tuple(exp),
                      timings(log, inp.settle_steps))
