"""The live view of a running drill, from the events seen so far: is the job steady, has it
restarted, is it stable again, should the drill be aborted? Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trainguard.drills.scenario import StopCondition
from trainguard.events.envelope import Event
from trainguard.events.payloads import CheckpointAction, CheckpointEvent, PoolUnit, StepReport


@dataclass(frozen=True)
class View:
    epoch: int | None  # the newest binding epoch that reported a step
    max_step: int
    steps_at_epoch: Mapping[int, int]  # rank -> steps reported at ``epoch`` after ``since``
    checkpoints: int  # checkpoints written
    spares: int  # units whose latest state is spare
    last_step_us: int | None  # event time of the newest step report
    epochs_after: int  # distinct epochs newer than ``base_epoch``


def view(events: Sequence[Event], *, since_us: int = 0, base_epoch: int | None = None) -> View:
    steps = [(e.event_time, e.payload) for e in events if isinstance(e.payload, StepReport)]
    epoch = max((p.binding_epoch for _, p in steps), default=None)
    at: dict[int, set[int]] = {}
    for t, p in steps:
        if p.binding_epoch == epoch and t >= since_us:
            at.setdefault(p.rank, set()).add(p.step)
    units: dict[str, str] = {}
    for e in events:
        if isinstance(e.payload, PoolUnit):
            units[e.payload.unit] = e.payload.state.value
    written = {e.payload.step for e in events if isinstance(e.payload, CheckpointEvent)
               and e.payload.action is CheckpointAction.WRITTEN}
    newer = {p.binding_epoch for _, p in steps
             if base_epoch is not None and p.binding_epoch > base_epoch}
    return View(epoch=epoch, max_step=max((p.step for _, p in steps), default=0),
                steps_at_epoch={r: len(s) for r, s in at.items()}, checkpoints=len(written),
                spares=sum(1 for s in units.values() if s == "spare"),
                last_step_us=max((t for t, _ in steps), default=None),
                epochs_after=len(newer))


def steady(v: View, world: int, steps: int, checkpoints: int, spares: int) -> str | None:
    """None when the preconditions hold, else what is still missing."""
    if len(v.steps_at_epoch) < world or min(v.steps_at_epoch.values()) < steps:
        return f"{steps} steps from each of {world} ranks (have {dict(v.steps_at_epoch)})"
    if v.checkpoints < checkpoints:
        return f"{checkpoints} checkpoint(s) written (have {v.checkpoints})"
    if v.spares < spares:
        return f"{spares} spare unit(s) (have {v.spares})"
    return None


def stable(v: View, world: int, settle_steps: int) -> bool:
    return len(v.steps_at_epoch) == world and min(v.steps_at_epoch.values()) >= settle_steps


def stop_reason(conditions: Sequence[StopCondition], v: View, *, now_us: int, fault_us: int,
                last_progress_us: int, max_live: Mapping[int, int]) -> str | None:
    """The first stop condition that holds, described; None when the drill may go on."""
    for c in conditions:
        if c.kind == "no_progress_s" and now_us - last_progress_us > c.value * 1e6:
            return f"no_progress_s: no new step for more than {c.value:g} s"
        if c.kind == "restarts_over" and v.epochs_after > c.value:
            return f"restarts_over: {v.epochs_after} restarts (> {c.value:g})"
        if c.kind == "replicas_over":
            many = {r: n for r, n in max_live.items() if n > c.value}
            if many:
                return f"replicas_over: live processes per rank {many} (> {c.value:g})"
        if c.kind == "wall_s" and now_us - fault_us > c.value * 1e6:
            return f"wall_s: {c.value:g} s since the fault"
    return None
