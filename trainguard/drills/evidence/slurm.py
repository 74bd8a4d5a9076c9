"""Slurm's own word on a node loss, as the runner read it when the window closed
(``archive.json`` ``slurm``: the actuator's journalled steps on the lost node and on the
spares, each as ``scontrol show step`` listed it, and the lost node's state and reason). Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainguard.drills.evidence.model import Check, Status


def _c(name: str, ok: bool, detail: str) -> Check:
    return Check("resources", name, Status.PASS if ok else Status.FAIL, detail)


def slurm_checks(facts: Mapping[str, Any]) -> list[Check]:
    node = str(facts.get("node", "?"))
    steps = list(facts.get("steps") or [])
    left = [s for s in steps if not s.get("gone")]
    gone_detail = ", ".join(f"step {s.get('step_id')} (rank {s.get('rank')} epoch "
                            f"{s.get('epoch')}): "
                            + ("not listed" if not s.get("listed") else
                               f"listed {s.get('listed_state')}, node DOWN and out of the job")
                            for s in steps)
    out = [_c("slurm:old_steps_gone", bool(steps) and not left,
              f"every step the actuator ran on {node} is gone in Slurm: {gone_detail}"
              if steps and not left else
              f"no step of the job was journalled on {node}" if not steps else
              "still alive in Slurm: " + ", ".join(
                  f"step {s.get('step_id')} ({s.get('listed_state')})" for s in left))]
    state, reason = str(facts.get("node_state", "")), str(facts.get("node_reason", ""))
    out.append(_c("slurm:lost_node_out_of_service",
                  reason.startswith("trainguard") and ("down" in state.lower()
                                                       or "drain" in state.lower()),
                  f"{node}: {state}, reason {reason!r}"))
    bound = [s for s in facts.get("spare_steps") or [] if s.get("listed")]
    out.append(_c("slurm:spare_bound", bool(bound),
                  "on the spare: " + ", ".join(f"rank {s.get('rank')} epoch {s.get('epoch')} "
                                               f"step {s.get('step_id')} on {s.get('unit')}"
                                               for s in bound)
                  if bound else "no step of the job runs on a spare node"))
    return out
