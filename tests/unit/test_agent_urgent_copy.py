"""The node agent spools an urgent event twice (its own topic, then the urgent topic; the same
key and bytes) and every other event once: the spool, and so the publisher, carries the copy
through an outage like any record."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.agent.metrics import AgentMetrics
from trainguard.agent.node_agent import AgentIdentity, NodeAgent
from trainguard.agent.publisher import SpoolPublisher
from trainguard.agent.spool import DiskSpool
from trainguard.bus.config import KafkaConfig
from trainguard.collectors.base import Discrete
from trainguard.events.codec import decode
from trainguard.events.envelope import Subject
from trainguard.events.payloads import NodeHealth, NodeHealthKind, ProcessExit, StepReport
from trainguard.events.topics import TopicNames

pytestmark = pytest.mark.unit


def test_an_urgent_event_is_spooled_for_its_topic_and_the_urgent_topic(tmp_path: Path) -> None:
    names = TopicNames("tgx")
    spool = DiskSpool(tmp_path / "spool")
    metrics = AgentMetrics()
    agent = NodeAgent(AgentIdentity("n7", "job-7"), [], spool,
                      SpoolPublisher(spool, KafkaConfig(bootstrap="127.0.0.1:1"), metrics),
                      names, metrics)
    agent.publish_discrete([
        Discrete(StepReport(rank=1, world_size=2, step=3, samples_consumed=96, compute_ms=9.0),
                 job_id="job-7", event_time=1_000, subject=Subject(rank=1)),
        Discrete(ProcessExit(pid=42, rank=1, signal=9), job_id="job-7", event_time=2_000,
                 subject=Subject(rank=1)),
        Discrete(NodeHealth(kind=NodeHealthKind.XID, code=79), job_id="job-7",
                 event_time=3_000, subject=Subject(gpu=0)),
    ])
    recs = spool.head(10)
    assert [(r.topic, r.event_type) for r in recs] == [
        ("tgx.task", "step.report"),
        ("tgx.task", "process.exit"), ("tgx.urgent", "process.exit"),
        ("tgx.telemetry", "node.health"), ("tgx.urgent", "node.health")]
    for own, copy in ((recs[1], recs[2]), (recs[3], recs[4])):
        assert (copy.key, copy.value) == (own.key, own.value)
        assert decode(copy.value).subject.node == "n7"
