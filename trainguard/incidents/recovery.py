"""When an incident counts as recovered: the evidence, as one pure function."""

from __future__ import annotations

from trainguard.events.payloads import OutcomeStatus
from trainguard.incidents.model import FenceRef, Incident, StepRef, VerdictRef


def left_behind(v: VerdictRef, fences: list[FenceRef]) -> bool:
    """The verdict's subject sat on a unit that was fenced: the fault stays with that unit."""
    for f in fences:
        if f.time < v.opened_time and f.time < v.first_time:
            continue
        same_node = v.subject.node is None or f.node is None or v.subject.node == f.node
        same_rank = v.subject.rank is None or f.rank is None or v.subject.rank == f.rank
        named = v.subject.node is not None or v.subject.rank is not None
        if named and same_node and same_rank:
            return True
    return False


def progress_after_heavy(inc: Incident) -> tuple[StepRef | None, str]:
    """The first step report that proves the job moved on after the latest migrate/resume."""
    cmd = inc.heavy_commands()[-1]
    final = cmd.final
    if final is None or final.status is not OutcomeStatus.DONE:
        return None, f"{cmd.action.value} not done"
    latest = {b.rank: b for b in inc.bindings if b.rank is not None}  # newest binding per rank
    bindings = [latest[r] for r in sorted(latest)]
    if bindings:
        got: list[StepRef] = []
        for b in bindings:
            steps = sorted((s for s in inc.progress.values() if s.rank == b.rank
                            and (b.epoch is None or s.epoch >= b.epoch)),
                           key=lambda s: (s.time, s.event_id))
            if not steps:
                return None, f"no step yet from rank {b.rank} epoch {b.epoch}"
            got.append(steps[0])
        return max(got, key=lambda s: (s.time, s.event_id)), "new binding stepped"
    if inc.loads:
        if inc.after_load is None:
            return None, "no step yet after the checkpoint load"
        return inc.after_load, "job stepped after the checkpoint load"
    first = sorted(inc.progress.values(), key=lambda s: (s.time, s.event_id))
    if not first:
        return None, "no step yet after the resume"
    return first[0], "job stepped after the resume"


def recovery_evidence(inc: Incident) -> tuple[bool, str, list[str]]:
    """(recovered?, why, the ids of the events that prove it)."""
    pending = [v for v in inc.verdicts.values()
               if v.resolved_time is None and not left_behind(v, inc.fences)]
    if pending:
        return False, f"{len(pending)} verdict(s) open", []
    causes: list[str] = []
    parts = ["verdicts resolved"]
    if inc.fences and any(v.resolved_time is None for v in inc.verdicts.values()):
        parts = ["verdicts resolved or left on fenced units"]
    heavy = inc.heavy_commands()
    if heavy:
        step, why = progress_after_heavy(inc)
        if step is None:
            return False, why, []
        final = heavy[-1].final
        assert final is not None
        causes += [final.event_id, step.event_id]
        parts.append(f"after {heavy[-1].action.value}: rank {step.rank} epoch {step.epoch} "
                     f"stepped (step {step.step}, samples {step.samples_consumed})")
    elif inc.commands:
        parts.append("after tier " + str(max(c.tier for c in inc.commands.values())))
    else:
        parts.append("without action")
    return True, "; ".join(parts), causes
