"""Slurm's own word on a node loss, as the runner read it when the window closed
(``archive.json`` ``slurm``: the actuator's journalled steps on the lost node and on the
spares, each as ``scontrol show step`` listed it, and the lost node's state and reason), each
check citing the events of the job's log that Slurm's state bears out: the ``pool.unit
fenced`` of each old step, the command and verdicts the drain reason names, the ``pool.unit
bound`` of each step on a spare. Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from trainguard.drills.evidence.log import JobLog
from trainguard.drills.evidence.model import Check, Status
from trainguard.events.envelope import Event
from trainguard.events.payloads import Command, PoolUnit, UnitState, Verdict


def _c(name: str, ok: bool, detail: str, cited: Iterable[Event] = ()) -> Check:
    events = sorted(cited, key=lambda e: e.event_time)
    return Check("resources", name, Status.PASS if ok else Status.FAIL, detail,
                 tuple(e.event_id for e in events), tuple(e.event_time for e in events))


def _units(log: JobLog, state: UnitState, unit: str | None, rank: Any, epoch: Any
           ) -> list[Event]:
    return [e for e in log.unit_events(state) if isinstance(e.payload, PoolUnit)
            and (unit is None or e.payload.unit == unit)
            and e.payload.rank == rank and e.payload.epoch == epoch]


def old_steps_gone(facts: Mapping[str, Any], log: JobLog) -> Check:
    node = str(facts.get("node", "?"))
    steps = list(facts.get("steps") or [])
    left = [s for s in steps if not s.get("gone")]
    if not steps:
        return _c("slurm:old_steps_gone", False, f"no step of the job was journalled on {node}")
    if left:
        return _c("slurm:old_steps_gone", False, "still alive in Slurm: " + ", ".join(
            f"step {s.get('step_id')} ({s.get('listed_state')})" for s in left))
    cited = [e for s in steps
             for e in _units(log, UnitState.FENCED, node, s.get("rank"), s.get("epoch"))]
    detail = ", ".join(f"step {s.get('step_id')} (rank {s.get('rank')} epoch "
                       f"{s.get('epoch')}): "
                       + ("not listed" if not s.get("listed") else
                          f"listed {s.get('listed_state')}, node DOWN and out of the job")
                       for s in steps)
    return _c("slurm:old_steps_gone", True, f"every step the actuator ran on {node} is gone "
              f"in Slurm: {detail}; fenced on the log: {len(cited)}", cited)


def lost_node_out_of_service(facts: Mapping[str, Any], log: JobLog) -> Check:
    """Down or drained, with a reason trainguard set; cited: the command and verdicts of this
    job that the reason names (``trainguard <command id> verdicts <verdict ids>``)."""
    node = str(facts.get("node", "?"))
    state, reason = str(facts.get("node_state", "")), str(facts.get("node_reason", ""))
    words = set(re.split(r"[\s;,:]+", reason))
    cited = [e for e in log.commands if isinstance(e.payload, Command)
             and e.payload.command_id in words]
    cited += [e for e in log.verdicts if isinstance(e.payload, Verdict)
              and e.payload.verdict_id in words]
    ok = reason.startswith("trainguard") and ("down" in state.lower()
                                              or "drain" in state.lower())
    return _c("slurm:lost_node_out_of_service", ok, f"{node}: {state}, reason {reason!r}"
              + (f"; the reason names {len(cited)} event(s) of this job" if ok else ""), cited)


def spare_bound(facts: Mapping[str, Any], log: JobLog) -> Check:
    bound = [s for s in facts.get("spare_steps") or [] if s.get("listed")]
    if not bound:
        return _c("slurm:spare_bound", False, "no step of the job runs on a spare node")
    cited = [e for s in bound
             for e in _units(log, UnitState.BOUND, s.get("unit"), s.get("rank"), s.get("epoch"))]
    return _c("slurm:spare_bound", True, "on the spare: " + ", ".join(
        f"rank {s.get('rank')} epoch {s.get('epoch')} step {s.get('step_id')} on "
        f"{s.get('unit')}" for s in bound), cited)


def slurm_checks(facts: Mapping[str, Any], log: JobLog) -> list[Check]:
    return [old_steps_gone(facts, log), lost_node_out_of_service(facts, log),
            spare_bound(facts, log)]
