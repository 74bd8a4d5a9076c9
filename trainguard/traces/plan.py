"""One incident -> the spans of its trace, as plain values (no OpenTelemetry objects yet).

Spans, all children of the ``incident`` root and all timed by event time:
- ``detect``: from the earliest anomaly of the verdicts the detection cites (or the detection
  itself when none is at hand) to the detection;
- ``locate``: detection -> located;
- ``action <action>``: one per command, from the command to its last final outcome (done,
  failed, timed out, refused), each outcome a span event; an error unless done;
- ``recover`` (or ``escalate`` / ``unrecoverable``): the last mitigating transition (else the
  location, else the detection) -> the end state; an error unless recovered.
Each transition is also an event on the root span.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentState, IncidentTransition, OutcomeStatus
from trainguard.traces.gather import CommandRecord, IncidentRecord, gather
from trainguard.traces.ids import span_id_for, trace_id_for

Attr = str | int | float | bool
Attrs = tuple[tuple[str, Attr], ...]
FINAL_OUTCOMES = frozenset({OutcomeStatus.DONE, OutcomeStatus.FAILED, OutcomeStatus.TIMED_OUT,
                            OutcomeStatus.REFUSED})
END_NAMES = {IncidentState.RECOVERED: "recover", IncidentState.ESCALATED: "escalate",
             IncidentState.UNRECOVERABLE: "unrecoverable", IncidentState.ENDED: "ended"}


@dataclass(frozen=True)
class SpanEvent:
    name: str
    time_us: int
    attributes: Attrs = ()


@dataclass(frozen=True)
class SpanPlan:
    key: str
    name: str
    span_id: int
    parent_id: int | None
    start_us: int
    end_us: int
    attributes: Attrs = ()
    events: tuple[SpanEvent, ...] = ()
    error: bool = False


@dataclass(frozen=True)
class TracePlan:
    incident_id: str
    job_id: str
    trace_id: int
    final_state: str | None
    spans: tuple[SpanPlan, ...]

    @property
    def complete(self) -> bool:
        return self.final_state is not None

    @property
    def root(self) -> SpanPlan:
        return self.spans[0]


def plan_traces(events: Iterable[Event]) -> list[TracePlan]:
    """A trace for every incident in the events, in incident-id order."""
    return [plan_incident(inc) for inc in gather(events)]


def plan_incident(inc: IncidentRecord) -> TracePlan:
    iid = inc.incident_id
    root_id = span_id_for(iid, "incident")
    times = _state_times(inc)
    detected = times.get(IncidentState.DETECTED, inc.start_us)
    children: list[SpanPlan] = [_detect(inc, detected, root_id)]
    located = times.get(IncidentState.LOCATED)
    if located is not None:
        children.append(_span(iid, "locate", "locate", root_id, detected, located))
    children += [_action(iid, rec, root_id, _fallback_end(inc)) for rec in inc.commands]
    end = inc.end
    if end is not None:
        e, t = end
        mitigating = [ev.event_time for ev, tr in inc.transitions
                      if tr.to_state is IncidentState.MITIGATING]
        start = mitigating[-1] if mitigating else located if located is not None else detected
        name = END_NAMES[t.to_state]
        children.append(_span(iid, name, name, root_id, start, e.event_time,
                              (("incident.reason", t.reason),),
                              error=t.to_state not in (IncidentState.RECOVERED,
                                                       IncidentState.ENDED)))
    root_start = min([detected, *(c.start_us for c in children)])
    root_end = max([_fallback_end(inc), *(c.end_us for c in children)])
    final = end[1].to_state.value if end is not None else None
    root = SpanPlan(
        "incident", "incident", root_id, None, root_start, root_end,
        (("incident.id", iid), ("job.id", inc.job_id),
         ("incident.final_state", final or "open"),
         ("incident.transitions", len(inc.transitions))),
        tuple(_transition_event(ev, tr) for ev, tr in inc.transitions),
        error=final is not None and final != IncidentState.RECOVERED.value)
    return TracePlan(iid, inc.job_id, trace_id_for(iid), final, (root, *children))


def _state_times(inc: IncidentRecord) -> dict[IncidentState, int]:
    times: dict[IncidentState, int] = {}
    for ev, tr in inc.transitions:
        times.setdefault(tr.to_state, ev.event_time)
    return times


def _fallback_end(inc: IncidentRecord) -> int:
    end = inc.end
    return end[0].event_time if end is not None else inc.transitions[-1][0].event_time


def _detect(inc: IncidentRecord, detected: int, parent: int) -> SpanPlan:
    onsets = [v.first_anomalous_time for _e, v in inc.verdicts]
    kinds = sorted({v.kind for _e, v in inc.verdicts})
    attrs: Attrs = (("verdict.kinds", ",".join(kinds)),) if kinds else ()
    return _span(inc.incident_id, "detect", "detect", parent, min([detected, *onsets]),
                 detected, attrs)


def _action(iid: str, rec: CommandRecord, parent: int, fallback_end: int) -> SpanPlan:
    cmd = rec.command
    start = rec.event.event_time
    finals = [(e, o) for e, o in rec.outcomes if o.status in FINAL_OUTCOMES]
    end = finals[-1][0].event_time if finals else max(start, fallback_end)
    status = finals[-1][1].status.value if finals else "pending"
    events = tuple(SpanEvent(o.status.value, e.event_time, (("detail", o.detail),))
                   for e, o in rec.outcomes)
    attrs: Attrs = (("command.id", cmd.command_id), ("command.action", cmd.action.value),
                    ("command.tier", cmd.tier), ("command.outcome", status))
    return _span(iid, f"action:{cmd.command_id}", f"action {cmd.action.value}", parent, start,
                 end, attrs, events, error=status not in ("done", "pending"))


def _span(iid: str, key: str, name: str, parent: int, start: int, end: int, attrs: Attrs = (),
          events: tuple[SpanEvent, ...] = (), *, error: bool = False) -> SpanPlan:
    return SpanPlan(key, name, span_id_for(iid, key), parent, start, max(start, end), attrs,
                    events, error)


def _transition_event(ev: Event, tr: IncidentTransition) -> SpanEvent:
    attrs: list[tuple[str, Attr]] = [("seq", tr.seq), ("reason", tr.reason)]
    if tr.tier is not None:
        attrs.append(("tier", tr.tier))
    return SpanEvent(tr.to_state.value, ev.event_time, tuple(attrs))
