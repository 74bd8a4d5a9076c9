"""`trainguard agent` as its own process, against the real broker and real rank processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.conftest import arun
from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import Delivered, EventConsumer
from trainguard.events.clock import now_us
from trainguard.events.payloads import NodeTelemetry, ProcessExit, ProcessState
from trainguard.events.topics import TopicRole

INTERVAL_S = 0.25


def _sleeper(rank: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TRAINGUARD_JOB_ID": "job-live", "TRAINGUARD_RANK": str(rank)}
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)


def _read(kafka: KafkaConfig) -> list[Delivered]:
    async def go() -> list[Delivered]:
        consumer = EventConsumer(kafka, [TopicRole.TELEMETRY, TopicRole.TASK], group_id=None,
                                 name="live-check", dlq=None)
        await consumer.start()
        try:
            return await consumer.drain(idle_ms=1000, limit_s=30)
        finally:
            await consumer.stop()

    return arun(go())


def test_agent_publishes_node_records_and_a_killed_rank_exit(kafka: KafkaConfig,
                                                             tmp_path: Path) -> None:
    ranks = [_sleeper(0), _sleeper(1)]
    agent = subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli.main", "agent", "--node", "node-live",
         "--bootstrap", kafka.bootstrap, "--prefix", kafka.topic_prefix, "--interval",
         str(INTERVAL_S), "--discover", "--metrics-port", "0", "--no-kernel-log",
         "--spool-dir", str(tmp_path / "spool"), "--socket", str(tmp_path / "agent.sock")],
        stderr=subprocess.PIPE)
    try:
        time.sleep(2.0)
        killed_at = now_us()
        ranks[1].send_signal(signal.SIGKILL)  # left a zombie: the agent reads its status
        time.sleep(1.5)
        agent.send_signal(signal.SIGTERM)
        _out, err = agent.communicate(timeout=30)
        assert agent.returncode == 0, err.decode()[-2000:]
    finally:
        for p in [*ranks, agent]:
            if p.poll() is None:
                p.kill()
                p.wait()

    events = _read(kafka)
    tele = [d.event for d in events if d.event.type == "telemetry.node"]
    exits = [d.event for d in events if d.event.type == "process.exit"]
    assert len(tele) >= 10
    assert all(e.subject.node == "node-live" for e in tele)
    seqs = [e.payload.seq for e in tele if isinstance(e.payload, NodeTelemetry)]
    assert seqs == list(range(len(seqs)))  # one record per interval, none lost
    before = [e for e in tele if e.event_time < killed_at and e.job_id == "job-live"]
    assert before, "no record carried the job's rank processes"
    last = before[-1].payload
    assert isinstance(last, NodeTelemetry)
    states = {s.rank: s.state for s in last.processes}
    assert states == {0: ProcessState.SLEEPING, 1: ProcessState.SLEEPING}

    assert len(exits) == 1, exits
    ex = exits[0]
    assert isinstance(ex.payload, ProcessExit)
    assert ex.job_id == "job-live" and ex.payload.rank == 1 and ex.payload.signal == 9
    assert ex.payload.pid == ranks[1].pid
    # Reported within one interval: no later than the next node record after the kill.
    after = [e.event_time for e in tele if e.event_time > killed_at]
    assert after and ex.event_time <= after[1]
