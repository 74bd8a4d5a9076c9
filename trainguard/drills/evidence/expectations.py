"""Did the loop pass through the states the scenario expects? Verdicts, actions, the resume,
the incident's end state, a corrupt checkpoint. Pure."""

from __future__ import annotations

from trainguard.drills.evidence.log import JobLog
from trainguard.drills.evidence.model import Check, Status
from trainguard.drills.scenario import Expect
from trainguard.events.envelope import Event
from trainguard.events.payloads import (
    CheckpointAction,
    Command,
    IncidentTransition,
    PoolUnit,
    UnitState,
    Verdict,
    VerdictKind,
)


def _c(name: str, ok: bool, detail: str, events: list[Event]) -> Check:
    return Check("expectation", name, Status.PASS if ok else Status.FAIL, detail,
                 tuple(e.event_id for e in events), tuple(e.event_time for e in events))


def expectations(log: JobLog, expect: Expect, lost_node: str | None = None) -> list[Check]:
    """``lost_node``: a node the fault took away; no replica may be bound on it again."""
    fault = log.fault_start() or 0
    out: list[Check] = []
    if lost_node is not None:
        back = [e for e in log.unit_events(UnitState.BOUND) if e.event_time >= fault
                and isinstance(e.payload, PoolUnit)
                and (e.payload.node == lost_node or lost_node in e.payload.labels.values())]
        out.append(_c(f"nothing_rebound_on:{lost_node}", not back,
                      f"no replica was bound on a unit of {lost_node} after it was lost"
                      if not back else "bound again on the lost node: " + ", ".join(
                          f"rank {e.payload.rank} on {e.payload.unit}" for e in back
                          if isinstance(e.payload, PoolUnit)), back[:4]))
    opened = [e for e in log.opened_verdicts() if e.event_time >= fault]
    kinds = {e.payload.kind for e in opened if isinstance(e.payload, Verdict)}
    for kind in expect.verdicts:
        hits = [e for e in opened if isinstance(e.payload, Verdict) and e.payload.kind == kind]
        out.append(_c(f"verdict:{kind}", bool(hits),
                      f"{len(hits)} {kind} verdict(s) opened after the fault" if hits else
                      f"no {kind} verdict after the fault (seen: {sorted(kinds) or 'none'})",
                      hits[:3]))
    done = [(c, o) for c, o in log.done_actions() if c.event_time >= fault]
    acted = {c.payload.action.value for c, _ in done if isinstance(c.payload, Command)}
    for action in expect.actions:
        hits = [x for c, o in done if isinstance(c.payload, Command)
                and c.payload.action.value == action for x in (c, o)]
        out.append(_c(f"action:{action}", bool(hits),
                      f"{action} commanded and done" if hits else
                      f"no {action} done after the fault (done: {sorted(acted) or 'none'})",
                      hits[:4]))
    if not expect.actions:
        cmds = [c for c in log.commands if c.event_time >= fault]
        names = sorted({c.payload.action.value for c in cmds if isinstance(c.payload, Command)})
        out.append(_c("no_action", not cmds, "the loop issued no command, as expected"
                      if not cmds else f"the loop acted though no action was expected: {names}",
                      cmds[:3]))
    old = log.epoch_before(fault)
    newer = [s for s in log.steps if old is not None and s.epoch > old]
    first = [min(newer, key=lambda s: s.time)] if newer else []
    out.append(Check("expectation", "resumed", Status.PASS if bool(newer) == expect.resumed
                     else Status.FAIL,
                     ("the job continued at a newer epoch" if newer else
                      "the job kept its epoch") + (" as expected" if bool(newer) ==
                                                   expect.resumed else ", not as expected"),
                     tuple(s.event_id for s in first), tuple(s.time for s in first)))
    trans = [e for e in log.incidents if e.event_time >= fault
             and isinstance(e.payload, IncidentTransition)]
    ends = [e for e in trans if isinstance(e.payload, IncidentTransition)
            and not e.payload.to_state.active]
    if expect.incident == "none":
        out.append(_no_incident(trans, kinds, expect.tolerate))
    else:
        hits = [e for e in ends if isinstance(e.payload, IncidentTransition)
                and e.payload.to_state.value == expect.incident]
        got = sorted({e.payload.to_state.value for e in ends
                      if isinstance(e.payload, IncidentTransition)})
        out.append(_c(f"incident:{expect.incident}", bool(hits),
                      f"an incident reached {expect.incident}" if hits else
                      f"no incident reached {expect.incident} (end states seen: {got or 'none'})",
                      hits[:2]))
    corrupt = log.ckpt(CheckpointAction.CORRUPT)
    if expect.checkpoint_corrupt or corrupt:
        ok = bool(corrupt) == expect.checkpoint_corrupt
        out.append(_c("checkpoint_corrupt", ok,
                      f"{len(corrupt)} corrupt checkpoint report(s)" + ("" if ok else
                                                                         ", not expected")
                      if corrupt else "no checkpoint was reported corrupt", corrupt[:3]))
    return out


def _no_incident(trans: list[Event], kinds: set[VerdictKind],
                 tolerate: tuple[VerdictKind, ...]) -> Check:
    """``incident: none``: nothing opened, or only incidents of tolerated verdict kinds that
    all recovered (whether the loop acted is the ``no_action`` check's)."""
    if not trans:
        return _c("incident:none", True, "no incident opened", [])
    ids = {e.payload.incident_id for e in trans if isinstance(e.payload, IncidentTransition)}
    recovered = {e.payload.incident_id for e in trans if isinstance(e.payload, IncidentTransition)
                 and e.payload.to_state.value == "recovered"}
    other = sorted(kinds - set(tolerate))
    if kinds and not other and ids <= recovered:
        return _c("incident:none", True,
                  f"{len(ids)} incident(s) opened only by tolerated verdicts "
                  f"({', '.join(sorted(kinds))}), all recovered", trans[:3])
    why = (f"verdicts not tolerated: {other}" if other else
           "an incident did not recover" if kinds else "an incident without a verdict")
    return _c("incident:none", False,
              f"{len(trans)} incident transition(s) after the fault ({why})", trans[:3])
