"""The four questions every incident must answer, from its fold and the job's events."""

from __future__ import annotations

from collections.abc import Sequence

from trainguard.events.clock import to_iso
from trainguard.events.envelope import Event
from trainguard.events.payloads import ProcessExit, Severity
from trainguard.incidents.model import Incident, StepRef, VerdictRef, order_key
from trainguard.timeline.model import QUESTIONS, Answer

QUESTION = dict(QUESTIONS)


def where(v: VerdictRef) -> str:
    doc = v.subject.model_dump(exclude_none=True)
    return ", ".join(f"{k} {val}" for k, val in doc.items()) or "the job"


def four_answers(inc: Incident, events: Sequence[Event]) -> list[Answer]:
    return [declared_unavailable(inc), old_replica_stopped(inc, events), new_resources(inc),
            continued_from(inc)]


def declared_unavailable(inc: Incident) -> Answer:
    causes = inc.cause_ranks()
    verdicts = sorted(inc.verdicts.values(), key=lambda v: (
        v.opened_time, v.subject.rank not in causes, v.verdict_id))
    crit = [v for v in verdicts if v.severity is Severity.CRITICAL]
    if crit:
        v = crit[0]
        return Answer("unavailable", QUESTION["unavailable"], True, v.opened_time,
                      f"{to_iso(v.opened_time)}: {v.kind} verdict (critical, rule {v.rule}) "
                      f"at {where(v)}; first anomalous {to_iso(v.first_time)}",
                      [v.open_event_id])
    v = verdicts[0]
    return Answer("unavailable", QUESTION["unavailable"], False, None,
                  f"never declared unavailable: degraded only ({v.kind}, {v.severity.value}, at "
                  f"{where(v)}, from {to_iso(v.opened_time)})", [v.open_event_id])


def _target_ranks(inc: Incident) -> set[int]:
    ranks = {b.rank for b in inc.bindings if b.rank is not None}
    ranks |= {f.rank for f in inc.fences if f.rank is not None}
    for c in inc.heavy_commands():
        if c.subject.rank is not None:
            ranks.add(c.subject.rank)
    return ranks or inc.ranks


def old_replica_stopped(inc: Incident, events: Sequence[Event]) -> Answer:
    degraded_only = not any(v.severity is Severity.CRITICAL for v in inc.verdicts.values())
    if degraded_only and not inc.heavy_commands() and not inc.fences:
        # A rank that was only slow kept its replica: another incident's exits nearby in
        # time are not this one's answer.
        return Answer("stopped", QUESTION["stopped"], False, None,
                      "not applicable: no replica was replaced", [])
    targets = _target_ranks(inc)
    # the ranks the decision moved as failed first, else the faulty ranks; a restart moves all
    primary = inc.cause_ranks() or (inc.ranks & targets) or targets
    start = min([v.first_time for v in inc.verdicts.values()] + [inc.opened_at])
    new_pids = {b.pid for b in inc.bindings if b.pid is not None}
    exits = [e for e in events if isinstance(e.payload, ProcessExit)
             and e.payload.rank in primary and e.event_time >= start - 5_000_000
             and e.payload.pid not in new_pids and e.job_id == inc.job_id]
    parts: list[str] = []
    ids: list[str] = []
    time: int | None = None
    if exits:
        e = min(exits, key=order_key)
        p = e.payload
        assert isinstance(p, ProcessExit)
        parts.append(f"{to_iso(e.event_time)}: rank {p.rank} pid {p.pid} exited ({p.ended}, "
                     f"seen via {p.detected_by})")
        ids.append(e.event_id)
        time = e.event_time
    mine = [f for f in inc.fences if f.rank in primary or f.rank is None]
    for f in mine:
        released = ", ".join(f.released) or "nothing listed"
        parts.append(f"{to_iso(f.time)}: unit {f.unit} fenced (rank {f.rank}, pid {f.pid}); "
                     f"released {released}")
        ids.append(f.event_id)
        time = f.time if time is None else time
    others = [f for f in inc.fences if f not in mine]
    if others:
        ranks = ", ".join(str(f.rank) for f in others)
        parts.append(f"also fenced by {to_iso(max(f.time for f in others))}: {len(others)} "
                     f"unit(s) of rank(s) {ranks}")
        ids += [f.event_id for f in others]
        time = min(f.time for f in others) if time is None else time
    if not parts:
        text = "not applicable: no replica was replaced" if not inc.heavy_commands() else \
            "not yet: no exit or fence seen"
        return Answer("stopped", QUESTION["stopped"], False, None, text, [])
    return Answer("stopped", QUESTION["stopped"], True, time, "; ".join(parts), ids)


def new_resources(inc: Incident) -> Answer:
    if not inc.bindings:
        text = "not applicable: no migration" if not inc.heavy_commands() else \
            "not yet: no new binding seen"
        return Answer("ready", QUESTION["ready"], False, None, text, [])
    newest = {b.rank: b for b in inc.bindings}  # the newest binding per rank
    ready = max(b.time for b in newest.values())
    focus = [b for r, b in newest.items() if r in inc.ranks] or list(newest.values())
    b = focus[-1]
    text = (f"{to_iso(b.time)}: unit {b.unit} on {b.node} bound to rank {b.rank}, epoch "
            f"{b.epoch}, pid {b.pid}")
    if len(newest) > 1:
        epochs = ", ".join(sorted({str(x.epoch) for x in newest.values()}))
        text += f"; all {len(newest)} ranks bound (epoch {epochs}) by {to_iso(ready)}"
    return Answer("ready", QUESTION["ready"], True, ready, text,
                  [x.event_id for x in newest.values()])


def _first_step(inc: Incident) -> StepRef | None:
    if inc.after_load is not None:
        return inc.after_load
    bound = {(b.rank, b.epoch) for b in inc.bindings}
    steps = sorted(inc.progress.values(), key=lambda s: (s.time, s.event_id))
    preferred = [s for s in steps if (s.rank, s.epoch) in bound]
    chosen = preferred or steps
    return chosen[0] if chosen else None


def continued_from(inc: Incident) -> Answer:
    step = _first_step(inc)
    if not inc.loads:
        if not inc.heavy_commands():
            return Answer("continued", QUESTION["continued"], False, None,
                          "not applicable: the job did not restart", [])
        return Answer("continued", QUESTION["continued"], False, None,
                      "not yet: no checkpoint load seen", [])
    ck = inc.loads[-1]
    text = f"checkpoint {ck.path}: step {ck.step}, samples {ck.samples_consumed} (loaded " \
           f"{to_iso(ck.time)})"
    ids = [ck.event_id]
    if step is None:
        return Answer("continued", QUESTION["continued"], False, None,
                      text + "; no step report after it yet", ids)
    if step.step == ck.step + 1 and step.samples_consumed > ck.samples_consumed:
        verdict = "continuous: no jump, no rerun"
    elif step.step > ck.step + 1:
        verdict = f"JUMP: {step.step - ck.step - 1} step(s) skipped"
    else:
        verdict = "RERUN: the step count went back past the checkpoint"
    if step.samples_consumed <= ck.samples_consumed:
        verdict += "; data position did not advance"
    text += (f"; first step after: step {step.step}, samples {step.samples_consumed} by rank "
             f"{step.rank} epoch {step.epoch} at {to_iso(step.time)} ({verdict})")
    return Answer("continued", QUESTION["continued"], True, step.time, text,
                  [*ids, step.event_id])
