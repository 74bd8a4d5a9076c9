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
from trainguard.dev.kafka import free_port
from trainguard.events.clock import now_us
from trainguard.events.payloads import NodeTelemetry, ProcessExit, ProcessState, StepReport
from trainguard.events.topics import TopicRole

INTERVAL_S = 0.25
SAMPLE_MARGIN_US = 1_000_000


def _rank(rank: int, sock: Path, port: int) -> subprocess.Popen[bytes]:
    """A real rank of the toy job, reporting through the StepReporter to the agent's socket."""
    env = {**os.environ, "TRAINGUARD_AGENT_SOCKET": str(sock)}
    return subprocess.Popen([sys.executable, "-m", "trainguard.demo.toy_job", "--job-id",
                             "job-live", "--rank", str(rank), "--world-size", "3",
                             "--coord", str(port)], env=env, stderr=subprocess.DEVNULL)


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
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli.main", "agent", "--node", "node-live",
         "--bootstrap", kafka.bootstrap, "--prefix", kafka.topic_prefix, "--interval-s",
         str(INTERVAL_S), "--metrics-port", "0", "--no-kernel-log", "--gpu", "none",
         "--spool-dir", str(tmp_path / "spool"), "--socket", str(sock)],
        stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not sock.exists() and time.monotonic() < deadline:  # the agent is listening
        time.sleep(0.05)
    port = free_port()
    ranks = [_rank(r, sock, port) for r in range(3)]
    try:
        time.sleep(4.0)
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
    steps = [d.event.payload for d in events if isinstance(d.event.payload, StepReport)]
    for r in range(3):  # every rank's reports arrive, in order, from step 0
        seen = [s.step for s in steps if s.rank == r]
        assert seen and seen == list(range(len(seen))), r
        assert all(s.pid == ranks[r].pid for s in steps if s.rank == r)
    assert len(tele) >= 10
    assert all(e.subject.node == "node-live" for e in tele)
    seqs = [e.payload.seq for e in tele if isinstance(e.payload, NodeTelemetry)]
    assert seqs == list(range(len(seqs)))  # one record per interval, none lost
    # A record is stamped when its interval starts and sampled after; on a loaded machine the
    # sampling can take a while, so only records stamped well before the kill show it unkilled.
    before = [e for e in tele
              if e.event_time < killed_at - SAMPLE_MARGIN_US and e.job_id == "job-live"]
    assert before, "no record carried the job's rank processes"
    last = before[-1].payload
    assert isinstance(last, NodeTelemetry)
    states = {s.rank: s.state for s in last.processes}
    assert set(states) == {0, 1, 2}  # watched from their first report, no discovery needed
    assert all(st in (ProcessState.RUNNING, ProcessState.SLEEPING) for st in states.values()), \
        states

    # The killed rank exits; the survivors then lose their peer and leave the job (code 3).
    # On a loaded machine the agent may see all three in one pass (one event time), in any
    # order: the signal, not the order, tells the killed rank.
    assert len(exits) == 3, exits
    (ex,) = [e for e in exits if isinstance(e.payload, ProcessExit) and e.payload.rank == 1]
    survivors = {e.payload.rank: e.payload.exit_code for e in exits
                 if isinstance(e.payload, ProcessExit) and e.payload.rank != 1}
    assert survivors == {0: 3, 2: 3}
    assert isinstance(ex.payload, ProcessExit)
    assert ex.job_id == "job-live" and ex.payload.signal == 9
    assert ex.event_time <= min(e.event_time for e in exits)  # never after a survivor's
    assert ex.payload.pid == ranks[1].pid
    # Reported within one interval: no later than the next node record after the kill.
    after = [e.event_time for e in tele if e.event_time > killed_at]
    assert after and ex.event_time <= after[1]
