"""The loop on a real job: a rank throttled for real through the cgroup CPU controller gets a
straggler verdict, a rank killed with SIGKILL gets a failure verdict — from the agent, through
Kafka, decided by a running `trainguard streams` worker (the demo's own run)."""

from __future__ import annotations

from trainguard.bus.config import KafkaConfig
from trainguard.demo.loop import JOB, run_demo
from trainguard.events.payloads import Verdict, VerdictState


def test_a_throttled_rank_and_a_killed_rank_get_located_verdicts(kafka: KafkaConfig) -> None:
    lines: list[str] = []
    run = run_demo(kafka, say=lines.append, seconds=12.0)
    injected = dict(run.injections)
    slow_at = injected["slowdown/start rank 2"]
    kill_at = injected["worker-exit/start rank 3"]
    opened = [(e, e.payload) for e in run.events if isinstance(e.payload, Verdict)
              and e.payload.state == VerdictState.OPEN and e.job_id == JOB]
    stragglers = [(e, v) for e, v in opened if v.kind == "straggler" and e.subject.rank == 2
                  and v.first_anomalous_time >= slow_at]
    assert stragglers, lines
    e, v = stragglers[0]
    assert e.subject.node == "demo-node"
    ratio = v.evidence["ratio"]
    # 10% of a core against a fair share: the verdict opens as soon as the rank's sequential
    # test is sure (a few steps in), when the medians of its last 5 steps may still hold the
    # onset: above the least effect the rule flags, not yet the full 2x
    assert isinstance(ratio, float) and ratio > 1.15
    exits = [(e, v) for e, v in opened if v.kind == "process_exit" and e.subject.rank == 3]
    assert len(exits) == 1, lines
    assert exits[0][1].evidence["signal"] == 9
    assert exits[0][1].first_anomalous_time >= kill_at
