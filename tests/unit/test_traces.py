"""Incident traces: ids from the incident id, spans from event times, the same trace on replay."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from trainguard.cli.main import main
from trainguard.events.codec import encode
from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentTransition
from trainguard.events.registry import BY_NAME
from trainguard.events.topics import TopicRole
from trainguard.metrics.scenario import episode
from trainguard.traces.ids import span_id_for, trace_id_for
from trainguard.traces.plan import TracePlan, plan_traces
from trainguard.traces.provider import emitter_for
from trainguard.traces.sink import IncidentTraceSink

T0 = 1_790_000_000_000_000
LOG = episode("job-t", T0, leave_open=True)


def _exported(plans: list[TracePlan]) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    emitter = emitter_for(exporter)
    for plan in plans:
        emitter.emit(plan)
    return list(exporter.get_finished_spans())


def _signature(spans: list[ReadableSpan]) -> list[tuple[object, ...]]:
    out: list[tuple[object, ...]] = []
    for s in spans:
        ctx = s.get_span_context()
        assert ctx is not None
        out.append((ctx.trace_id, ctx.span_id, s.parent.span_id if s.parent else None, s.name,
                    s.start_time, s.end_time, tuple(sorted((s.attributes or {}).items())),
                    tuple((e.name, e.timestamp) for e in s.events), s.status.status_code))
    return out


def test_ids_are_derived_from_the_incident_id() -> None:
    assert trace_id_for("inc-1") == trace_id_for("inc-1") != trace_id_for("inc-2")
    assert 0 < trace_id_for("inc-1") < 2**128
    assert 0 < span_id_for("inc-1", "detect") < 2**64
    assert span_id_for("inc-1", "detect") != span_id_for("inc-1", "locate")


def test_one_trace_per_incident_with_a_span_per_phase_in_event_time() -> None:
    spans = _exported(plan_traces(LOG))
    by_trace: dict[int, list[ReadableSpan]] = defaultdict(list)
    for s in spans:
        ctx = s.get_span_context()
        assert ctx is not None
        by_trace[ctx.trace_id].append(s)
    incidents = sorted({e.payload.incident_id for e in LOG
                        if isinstance(e.payload, IncidentTransition)})
    assert set(by_trace) == {trace_id_for(i) for i in incidents}
    times = {e.event_id: e.event_time for e in LOG}
    exit_incident = next(e.payload.incident_id for e in LOG
                         if isinstance(e.payload, IncidentTransition)
                         and e.payload.reason == "process_exit verdict")
    trace = {s.name: s for s in by_trace[trace_id_for(exit_incident)]}
    assert set(trace) == {"incident", "detect", "locate", "action migrate", "action resume",
                          "recover"}
    root = trace["incident"]
    assert root.parent is None
    for name in ("detect", "locate", "action migrate", "action resume", "recover"):
        parent = trace[name].parent
        assert parent is not None and parent.span_id == span_id_for(exit_incident, "incident")
    transitions = [e for e in LOG if isinstance(e.payload, IncidentTransition)
                   and e.payload.incident_id == exit_incident]
    detected, located, *_rest, recovered = (e.event_time * 1000 for e in transitions)
    assert trace["locate"].start_time == detected and trace["locate"].end_time == located
    assert trace["detect"].start_time == detected - 1_000_000_000  # verdict's first anomaly
    assert trace["recover"].end_time == recovered == root.end_time
    assert trace["action migrate"].status.status_code is StatusCode.ERROR
    assert trace["action resume"].status.status_code is not StatusCode.ERROR
    assert [e.name for e in trace["action migrate"].events] == ["accepted", "failed"]
    for name in ("locate", "action migrate", "action resume", "recover"):
        start = trace[name].start_time
        assert start is not None and start // 1000 in times.values()  # an event's time


def test_the_live_sink_emits_each_ended_incident_once_and_not_the_open_one() -> None:
    exporter = InMemorySpanExporter()
    sink = IncidentTraceSink(emitter_for(exporter))
    for e in LOG + LOG[-20:]:  # redelivered tail: the recovery again
        sink(e)
    traces = {sig[0] for sig in _signature(list(exporter.get_finished_spans()))}
    ended = [p for p in plan_traces(LOG) if p.complete]
    assert traces == {p.trace_id for p in ended} and len(ended) == 3
    assert len(exporter.get_finished_spans()) == sum(len(p.spans) for p in ended)
    assert sorted(_signature(list(exporter.get_finished_spans())), key=repr) == sorted(
        _signature(_exported(ended)), key=repr)


@st.composite
def replayed(draw: st.DrawFn) -> list[Event]:
    """The log as a replay may deliver it: equal-time events in any order, some twice."""
    groups: dict[int, list[Event]] = defaultdict(list)
    for e in LOG:
        groups[e.event_time].append(e)
    out: list[Event] = []
    for t in sorted(groups):
        group = draw(st.permutations(groups[t]))
        dups = draw(st.lists(st.sampled_from(group), max_size=2))
        out += draw(st.permutations([*group, *dups]))
    return out


EXPECTED = _signature(_exported(plan_traces(LOG)))


@settings(max_examples=40, deadline=None)
@given(replayed())
def test_a_replayed_log_yields_the_same_traces(log: list[Event]) -> None:
    assert _signature(_exported(plan_traces(log))) == EXPECTED


def test_cli_builds_traces_from_an_exported_log(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(b"".join(encode(e) + b"\n" for e in LOG))
    assert main(["metrics", "traces", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    ended = [p for p in plan_traces(LOG) if p.complete]
    assert len(out) == 3
    for plan, line in zip(ended, out, strict=True):
        assert f"trace {plan.trace_id:032x}" in line and f"{plan.final_state}:" in line


@st.composite
def read_across_topics(draw: st.DrawFn) -> list[Event]:
    """The log as one consumer of every topic may read it: each topic in order, the topics
    interleaved any way (Kafka orders a partition, not the topics)."""
    queues: dict[TopicRole, list[Event]] = defaultdict(list)
    for e in LOG:
        queues[BY_NAME[e.type].topic].append(e)
    out: list[Event] = []
    while queues:
        role = draw(st.sampled_from(sorted(queues)))
        out.append(queues[role].pop(0))
        if not queues[role]:
            del queues[role]
    return out


ENDED = sorted(_signature(_exported([p for p in plan_traces(LOG) if p.complete])), key=repr)


@settings(max_examples=60, deadline=None)
@given(read_across_topics())
def test_the_live_sink_waits_for_what_an_end_cites_whatever_the_topic_order(
        log: list[Event]) -> None:
    exporter = InMemorySpanExporter()
    sink = IncidentTraceSink(emitter_for(exporter), clock=lambda: 0.0)
    for e in log:
        sink(e)
    sink.tick()  # the grace never passes here: every trace went out because all it cites came
    assert sorted(_signature(list(exporter.get_finished_spans())), key=repr) == ENDED


def test_an_end_whose_cited_event_never_comes_goes_out_after_the_grace() -> None:
    now = [0.0]
    exporter = InMemorySpanExporter()
    sink = IncidentTraceSink(emitter_for(exporter), grace_s=10.0, clock=lambda: now[0])
    commands = {e.event_id for e in LOG if e.type == "command"}
    for e in LOG:
        if e.event_id not in commands:
            sink(e)
    sink.tick()
    assert not exporter.get_finished_spans()  # every ended incident cites a command
    now[0] = 9.9
    sink.tick()
    assert not exporter.get_finished_spans()
    now[0] = 10.0
    sink.tick()
    spans = exporter.get_finished_spans()
    assert {s.name for s in spans if s.parent is None} == {"incident"}
    assert len({s.get_span_context().trace_id for s in spans}) == 3  # type: ignore[union-attr]
    assert not any(s.name.startswith("action") for s in spans)
    for e in LOG:  # the commands come after all: nothing is sent twice
        if e.event_id in commands:
            sink(e)
    sink.flush()
    assert len(exporter.get_finished_spans()) == len(spans)


def test_flush_sends_what_still_waits() -> None:
    exporter = InMemorySpanExporter()
    sink = IncidentTraceSink(emitter_for(exporter), clock=lambda: 0.0)
    verdicts = {e.event_id for e in LOG if e.type == "verdict"}
    for e in LOG:
        if e.event_id not in verdicts:
            sink(e)
    assert not exporter.get_finished_spans()
    sink.flush()
    assert len({s.get_span_context().trace_id  # type: ignore[union-attr]
                for s in exporter.get_finished_spans()}) == 3
