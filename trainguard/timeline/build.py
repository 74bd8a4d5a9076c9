"""One incident + the job's events -> its ``Timeline`` (window, tracks, the four answers)."""

from __future__ import annotations

from collections.abc import Sequence

from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentTransition, Injection
from trainguard.incidents.model import Incident, order_key
from trainguard.timeline.answers import four_answers
from trainguard.timeline.marks import (
    action_marks,
    detection_marks,
    gpu_marks,
    network_marks,
    resource_marks,
    task_marks,
)
from trainguard.timeline.model import TRACKS, Step, Timeline

MARGIN_US = 5_000_000  # shown before the first sign and after the close
DRILL_LOOKBACK_US = 60_000_000  # an injection this long before the opening belongs to it
NODE_TYPES = frozenset({"telemetry.node", "node.health"})


def window(inc: Incident, events: Sequence[Event]) -> tuple[int, int]:
    first = min([v.first_time for v in inc.verdicts.values()] + [inc.opened_at])
    drills = [e.event_time for e in events if isinstance(e.payload, Injection)
              and e.job_id == inc.job_id and e.payload.phase == "start"
              and first - DRILL_LOOKBACK_US <= e.event_time <= first]
    start = min([first, *drills]) - MARGIN_US
    last = inc.closed_at if inc.closed_at is not None else max(
        [inc.last_time, *[e.event_time for e in events if e.job_id == inc.job_id]])
    return start, last + MARGIN_US


def nodes_of(inc: Incident, events: Sequence[Event]) -> set[str]:
    nodes = set(inc.nodes) | {b.node for b in inc.bindings if b.node} | {
        f.node for f in inc.fences if f.node}
    nodes |= {e.subject.node for e in events if e.job_id == inc.job_id and e.subject.node
              and e.type == "step.report"}
    return nodes


def in_window(inc: Incident, events: Sequence[Event]) -> list[Event]:
    start, end = window(inc, events)
    nodes = nodes_of(inc, events)
    out = [e for e in events if start <= e.event_time <= end
           and (e.job_id == inc.job_id or (e.type in NODE_TYPES and e.subject.node in nodes))
           and e.type != "incident.transition"]
    return sorted({e.event_id: e for e in out}.values(), key=order_key)


def build_timeline(inc: Incident, events: Sequence[Event]) -> Timeline:
    start, end = window(inc, events)
    shown = in_window(inc, events)
    marks = (task_marks(shown) + network_marks(shown) + gpu_marks(shown)
             + resource_marks(shown) + action_marks(inc, shown) + detection_marks(inc))
    marks.sort(key=lambda m: (TRACKS.index(m.track), m.time, m.lane, m.label))
    steps = []
    for t in inc.transitions:
        p = t.payload
        assert isinstance(p, IncidentTransition)
        steps.append(Step(t.event_time, p.seq, p.from_state.value if p.from_state else None,
                          p.to_state.value, p.tier, p.reason, t.event_id))
    subject = ", ".join(f"{k} {v}" for k, v in inc.subject.model_dump(exclude_none=True).items())
    return Timeline(
        incident_id=inc.incident_id, job_id=inc.job_id, subject=subject or "the job",
        state=inc.state.value if inc.state else "?", tier=inc.tier, opened_at=inc.opened_at,
        closed_at=inc.closed_at, start=start, end=end, answers=four_answers(inc, shown),
        transitions=steps, marks=marks,
        verdict_kinds=sorted({v.kind for v in inc.verdicts.values()}))
