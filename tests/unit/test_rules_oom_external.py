"""OOM kills and external fault feeds -> verdicts, incidents, the policy's class, a metric."""

from __future__ import annotations

import random

import pytest

from tests.unit.rules_support import RULES, T0, S, kinds, run
from trainguard.events.codec import encode
from trainguard.events.envelope import Event
from trainguard.events.payloads import (
    IncidentState,
    IncidentTransition,
    NodeHealth,
    NodeHealthKind,
    Verdict,
    VerdictClass,
    VerdictKind,
)
from trainguard.incidents.aggregate import rebuild
from trainguard.metrics.recorder import Recorder
from trainguard.metrics.registry import PipelineMetrics
from trainguard.offline.imports import fault_events, kmsg_events
from trainguard.rules import replay
from trainguard.rules.synth import node_health, step_report

pytestmark = pytest.mark.unit

KILL = ("[ 1600.000000] Out of memory: Killed process {pid} (python) total-vm:1kB, anon-rss:1kB, "
        "file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB oom_score_adj:0")


def _steps(first: int, n: int, pids: dict[int, int]) -> list[Event]:
    return [step_report("j", r, s, T0 + s * S + r, 500.0, world=4, node="n1", pid=pids[r])
            for s in range(first, first + n) for r in range(4)]


def _kill(pid: int, t: int, line: str = KILL) -> list[Event]:
    text = line.format(pid=pid)
    return kmsg_events(text, name="k.log", node="n1", job_id="j",
                       boot_time_us=t - 1600 * S).events


# --- OOM ----------------------------------------------------------------------------------


def test_an_oom_killed_rank_is_a_critical_verdict_at_the_rank_until_it_steps_again() -> None:
    pids = {r: 4000 + r for r in range(4)}
    events = _steps(0, 5, pids) + _kill(4002, T0 + 5 * S + 500_000)
    events += _steps(8, 3, {**pids, 2: 5002})  # the rank back in a new process
    out = run(events)
    oom = [v for v in out if isinstance(v.payload, Verdict) and v.payload.rule == "oom-kill"]
    assert kinds(oom) == [("oom_kill", "open"), ("oom_kill", "resolved")]
    opened = oom[0]
    assert (opened.subject.rank, opened.subject.node) == (2, "n1")
    assert isinstance(opened.payload, Verdict)
    assert opened.payload.severity.value == "critical"
    assert opened.payload.evidence["pid"] == 4002
    assert opened.event_time == T0 + 5 * S + 500_000
    # the policy treats it as a failure (migrate + resume), like a process exit
    assert VerdictKind.OOM_KILL.verdict_class is VerdictClass.FAILURE


def test_a_kill_printed_three_ways_opens_once() -> None:
    pids = {r: 4000 + r for r in range(4)}
    text = "\n".join([
        "[ 1600.000000] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=x,"
        "mems_allowed=0,oom_memcg=/k,task_memcg=/k/p,task=python,pid=4001,uid=0",
        "[ 1600.000100] Memory cgroup out of memory: Killed process 4001 (python) total-vm:1kB",
        "[ 1600.000200] oom_reaper: reaped process 4001 (python), now anon-rss:0kB, file-rss:0kB"])
    health = kmsg_events(text, name="k.log", node="n1", job_id="j",
                         boot_time_us=T0 + 5 * S - 1600 * S).events
    assert len(health) == 1
    out = run(_steps(0, 5, pids) + health)
    assert kinds(out) == [("oom_kill", "open")]


def test_a_kill_of_another_process_is_a_node_warning_that_resolves_when_quiet() -> None:
    pids = {r: 4000 + r for r in range(4)}
    events = _steps(0, 3, pids) + _kill(777, T0 + 3 * S)
    events.append(node_health("j", "n1", NodeHealthKind.LINK_UP, T0 + 700 * S, device="x"))
    out = [v for v in run(events) if isinstance(v.payload, Verdict)
           and v.payload.rule == "oom-kill"]
    assert kinds(out) == [("oom_kill_process", "open"), ("oom_kill_process", "resolved")]
    assert (out[0].subject.rank, out[0].subject.node) == (None, "n1")
    assert isinstance(out[0].payload, Verdict) and out[0].payload.severity.value == "warning"
    assert VerdictKind.OOM_KILL_PROCESS.verdict_class is VerdictClass.INFO


# --- external faults ----------------------------------------------------------------------


def _fault_log(n_nodes: int, seed: int) -> str:
    """Many nodes; per node overlapping faults of one class, and faults of two classes."""
    rng = random.Random(seed)
    rows = ["node,start,end,fault_class"]
    for i in range(n_nodes):
        a = T0 // S + rng.randint(0, 3600)
        rows.append(f"node-{i},{a},{a + 600},gpu")
        rows.append(f"node-{i},{a + 300},{a + 900},gpu")  # overlaps the first
        if i % 3 == 0:
            rows.append(f"node-{i},{a + 100},{a + 200},network")
        if i % 7 == 0:
            rows.append(f"node-{i},{a + 1000},,power")  # still going
    return "\n".join(rows) + "\n"


def _by_job(events: list[Event]) -> dict[str, list[Event]]:
    jobs: dict[str, list[Event]] = {}
    for e in sorted(events, key=lambda e: (e.event_time, e.event_id)):
        jobs.setdefault(e.job_id, []).append(e)
    return jobs


def test_external_faults_open_and_resolve_per_node_and_class_and_incidents_pair() -> None:
    n = 60
    events = fault_events(_fault_log(n, 1), name="f.csv", fmt="csv").events
    verdicts: list[Event] = []
    for job, evs in _by_job(events).items():
        verdicts += replay(evs, RULES, job)
    vs = [v.payload for v in verdicts if isinstance(v.payload, Verdict)]
    assert {v.kind for v in vs} == {"external_fault"}
    opened = {v.verdict_id for v in vs if v.state.value == "open"}
    resolved = {v.verdict_id for v in vs if v.state.value == "resolved"}
    still = {i for i in range(n) if i % 7 == 0}
    # one verdict per (node, class); overlapping gpu faults nest into one
    assert len(opened) == n + len(range(0, n, 3)) + len(still)
    assert len(resolved) == len(opened) - len(still)
    assert all(sum(1 for v in vs if v.verdict_id == vid) <= 2 for vid in opened)
    # the gpu verdict resolves at the later end of the two overlapping faults
    first = [v for v in verdicts if v.job_id == "node:node-1" and isinstance(v.payload, Verdict)
             and v.payload.evidence.get("fault_class") == "gpu"]
    assert kinds(first) == [("external_fault", "open"), ("external_fault", "resolved")]
    assert first[1].event_time - first[0].event_time == 900 * S
    # incidents: one per node's job, recovered unless a fault is still going
    transitions = rebuild(verdicts)
    final: dict[str, IncidentState] = {}
    for t in transitions:
        assert isinstance(t.payload, IncidentTransition)
        final[t.job_id] = t.payload.to_state
    assert len(final) == n
    for i in range(n):
        want = IncidentState.RECOVERED if i not in still else IncidentState.LOCATED
        assert final[f"node:node-{i}"] is want, i
    assert VerdictKind.EXTERNAL_FAULT.verdict_class is VerdictClass.INFO


def test_an_end_without_a_start_is_ignored() -> None:
    text = f"node,start,end,fault_class\nn1,{T0 // S - 100},{T0 // S - 50},gpu\n"
    evs = [e for e in fault_events(text, name="f.csv", fmt="csv").events
           if isinstance(e.payload, NodeHealth)
           and e.payload.kind is NodeHealthKind.EXTERNAL_FAULT_END]
    assert replay(evs, RULES, "node:n1") == []


def test_external_fault_replay_is_deterministic_under_arrival_reordering() -> None:
    events = fault_events(_fault_log(20, 2), name="f.csv", fmt="csv").events
    jobs = _by_job(events)
    rng = random.Random(5)
    for job, evs in jobs.items():
        base = b"".join(encode(v) for v in replay(evs, RULES, job))
        shuffled = list(evs)
        rng.shuffle(shuffled)  # all far apart: the reorder buffer restores event-time order
        ordered = sorted(shuffled, key=lambda e: e.event_time)
        assert b"".join(encode(v) for v in replay(ordered + ordered[:3], RULES, job)) == base


def test_nodes_with_an_open_external_fault_is_a_fleet_gauge() -> None:
    events = fault_events(_fault_log(10, 3), name="f.csv", fmt="csv").events
    verdicts: list[Event] = []
    for job, evs in _by_job(events).items():
        verdicts += replay(evs, RULES, job)
    rec = Recorder(PipelineMetrics())
    peak = 0
    open_nodes: dict[str, int] = {}
    for v in sorted(verdicts, key=lambda e: (e.event_time, e.event_id)):
        rec.observe(v, "verdicts")
        assert isinstance(v.payload, Verdict)
        node = v.subject.node or ""
        open_nodes[node] = open_nodes.get(node, 0) + (1 if v.payload.state.value == "open"
                                                      else -1)
        want = sum(1 for c in open_nodes.values() if c > 0)
        got = rec.metrics.registry.get_sample_value("trainguard_nodes_external_fault")
        assert got == want
        peak = max(peak, want)
    assert peak > 1
    assert rec.metrics.registry.get_sample_value("trainguard_nodes_external_fault") == 2  # power


def test_a_fault_start_opens_on_arrival_in_the_prompt_lane_and_is_not_repeated() -> None:
    from trainguard.rules.engine import RuleEngine

    text = (f"node,start,end,fault_class\nn1,{T0 // S},{T0 // S + 60},gpu\n"
            f"n1,{T0 // S + 600},,gpu\n")
    start, end, later = fault_events(text, name="f.csv", fmt="csv").events
    live = RuleEngine("node:n1", RULES, prompt=True)
    first = live.feed(start)  # nothing else from this node yet: the watermark cannot pass it
    assert kinds(first) == [("external_fault", "open")]
    rest = live.feed(end) + live.feed(later) + live.flush()
    assert kinds(rest) == [("external_fault", "resolved"), ("external_fault", "open")]
    ordered = replay([start, end, later], RULES, "node:n1")
    assert [encode(v) for v in first + rest] == [encode(v) for v in ordered]
