"""Recovery times measured from the log: observations under stated conditions, not an SLA."""

from __future__ import annotations

from trainguard.drills.evidence.log import JobLog
from trainguard.events.payloads import (
    CheckpointAction,
    Command,
    CommandOutcome,
    FenceData,
    RestartData,
    UnitState,
    Verdict,
)


def timings(log: JobLog, settle_steps: int) -> dict[str, float | int | None]:
    """Seconds from the fault's start to each phase (None when the phase did not happen)."""
    fault = log.fault_start()
    if fault is None:
        return {}

    def since(t: int | None) -> float | None:
        return None if t is None else round((t - fault) / 1e6, 3)

    verdicts = [e.payload.decided_time for e in log.opened_verdicts()
                if isinstance(e.payload, Verdict) and e.event_time >= fault]
    cmds = [e.payload.issued_at for e in log.commands
            if isinstance(e.payload, Command) and e.event_time >= fault]
    fenced = [e.event_time for e in log.unit_events(UnitState.FENCED) if e.event_time >= fault]
    bound = [e.event_time for e in log.unit_events(UnitState.BOUND) if e.event_time >= fault]
    # a rank of the new binding loaded the checkpoint: rendezvous and restore are done
    loaded = [e.event_time for e in log.ckpt(CheckpointAction.LOADED) if e.event_time >= fault]
    old = log.epoch_before(fault)
    end = log.fault_end() or fault
    new = sorted((s for s in log.steps if old is not None and s.epoch > old),
                 key=lambda s: s.time)
    after = new or sorted((s for s in log.steps if s.time > end), key=lambda s: s.time)
    stable_at = None
    if after:
        final = max(s.epoch for s in after)
        steps = sorted({(s.step, s.time) for s in after if s.epoch == final and s.rank == 0})
        if len(steps) >= settle_steps:
            stable_at = steps[settle_steps - 1][1]
    redone = None
    if new and old is not None:
        last_old = max((s.step for s in log.steps if s.epoch == old), default=0)
        redone = max(0, last_old - (new[0].step - 1))
    fence_ms = [e.payload.data.fence_ms for e in log.outcomes
                if isinstance(e.payload, CommandOutcome) and e.event_time >= fault
                and isinstance(e.payload.data, RestartData | FenceData)]
    return {
        "detected_s": since(min(verdicts) if verdicts else None),
        "first_command_s": since(min(cmds) if cmds else None),
        "fenced_s": since(min(fenced) if fenced else None),
        "bound_s": since(max(bound) if bound else None),
        "restored_s": since(min(loaded) if loaded else None),
        "first_step_after_s": since(after[0].time if after else None),
        "stable_s": since(stable_at),
        "steps_redone": redone,
        "fence_ms": next((v for v in fence_ms if v is not None), None),
    }
