"""A replay's result as text (and as JSON-ready data)."""

from __future__ import annotations

from typing import Any

from trainguard.events.clock import to_iso
from trainguard.events.envelope import Event
from trainguard.events.payloads import Verdict
from trainguard.replay.diff import IncidentSummary, verdict_line
from trainguard.replay.run import ReplayResult


def _window(r: ReplayResult) -> str:
    a = to_iso(r.window.start) if r.window.start is not None else "the start"
    b = to_iso(r.window.end) if r.window.end is not None else "the end"
    return f"{a} .. {b}"


def render_report(r: ReplayResult) -> str:
    v, i = r.verdicts, r.incidents
    recorded = ", ".join(r.recorded_rules_versions) or "none recorded"
    src = "recorded transitions" if r.incidents_recorded else \
        "incidents rebuilt from the recorded verdicts (the log holds no transitions)"
    lines = [f"replay of {_window(r)} with rules {r.rules_version} (recording: {recorded})"]
    if r.retracted:
        lines.append(f"left out: {r.retracted} verdict(s) the live prompt lane retracted "
                     "(they depend on arrival order)")
    if not r.what_if and r.exact:
        lines.append(f"REPRODUCED EXACTLY: {v.same} verdicts and {len(i.same)} incidents "
                     f"({len(r.replayed_transitions)} transitions), compared with {src}")
        return "\n".join(lines) + "\n"
    if r.mode == "what_if_unrecorded":
        lines.append("WHAT-IF: the log records no verdicts (an imported history, or one no "
                     "rules ran on): nothing to reproduce; what the rules find")
    elif r.what_if:
        lines.append("WHAT-IF: other rules than the recording's; compared with " + src)
    else:
        lines.append("DIFFERENCES with the recorded rules; compared with " + src)
    lines.append(f"verdicts: {v.same} same, {len(v.missing)} gone, {len(v.extra)} new, "
                 f"{len(v.changed)} changed")
    lines += [f"  gone:    {verdict_line(e)}" for e in v.missing]
    lines += [f"  new:     {verdict_line(e)}" for e in v.extra]
    lines += [f"  changed: {verdict_line(a)}\n        -> {verdict_line(b)}" for a, b in v.changed]
    lines.append(f"incidents: {len(i.same)} same, {len(i.vanish)} would vanish, "
                 f"{len(i.appear)} would appear, {len(i.change)} would change")
    lines += [f"  vanish:  {s.line()}" for s in i.vanish]
    lines += [f"  appear:  {s.line()}" for s in i.appear]
    for c in i.change:
        lines.append(f"  change:  {c.recorded.line()}")
        lines += [f"           {d}" for d in c.differences]
    return "\n".join(lines) + "\n"


def _summary(s: IncidentSummary) -> dict[str, Any]:
    return {"incident_id": s.incident_id, "job_id": s.job_id, "subject": s.subject,
            "opened_at": s.opened_at, "opened_by": s.opened_by, "final_state": s.final_state,
            "tier": s.tier, "path": list(s.path)}


def verdict_doc(e: Event) -> dict[str, Any]:
    p = e.payload
    assert isinstance(p, Verdict)
    return {"event_id": e.event_id, "verdict_id": p.verdict_id, "job_id": e.job_id,
            "rule": p.rule, "kind": p.kind.value, "state": p.state.value,
            "severity": p.severity.value, "subject": e.subject.model_dump(exclude_none=True),
            "event_time": e.event_time, "first_anomalous_time": p.first_anomalous_time,
            "decided_time": p.decided_time, "rules_version": p.rules_version,
            "evidence": dict(p.evidence)}


def report_doc(r: ReplayResult) -> dict[str, Any]:
    """Everything the text says, whole: each gone / new / changed verdict with its kind,
    subject, severity, state and evidence, and every incident (same, vanish, appear, change)."""
    v, i = r.verdicts, r.incidents
    return {
        "mode": r.mode, "exit_code": r.exit_code,
        "rules_version": r.rules_version, "recorded_rules_versions": r.recorded_rules_versions,
        "window": {"start": r.window.start, "end": r.window.end}, "what_if": r.what_if,
        "exact": r.exact, "verdicts_recorded": r.verdicts_recorded,
        "incidents_recorded": r.incidents_recorded, "retracted": r.retracted,
        "verdicts": {"same": v.same, "gone": [verdict_doc(e) for e in v.missing],
                     "new": [verdict_doc(e) for e in v.extra],
                     "changed": [{"recorded": verdict_doc(a), "replayed": verdict_doc(b)}
                                 for a, b in v.changed]},
        "incidents": {"same": [_summary(s) for s in i.same],
                      "vanish": [_summary(s) for s in i.vanish],
                      "appear": [_summary(s) for s in i.appear],
                      "change": [{"recorded": _summary(c.recorded),
                                  "replayed": _summary(c.replayed),
                                  "differences": list(c.differences)} for c in i.change]},
    }
