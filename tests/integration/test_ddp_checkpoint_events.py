"""Checkpoint records reach Kafka through the node agent: the reference workload (one rank,
real torch) writes checkpoints, a flipped bit makes the newest corrupt, and the restarted
rank reports corrupt -> verified -> loaded for the previous one; `trainguard agent` publishes
every record as a `checkpoint` event on the task topic, keyed by the job, subject = rank."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from tests.integration.conftest import read_events
from tests.integration.ddp_support import Job, wait_all
from trainguard.bus.config import KafkaConfig
from trainguard.dev.kafka import free_port
from trainguard.events.payloads import CheckpointEvent
from trainguard.events.topics import TopicRole
from trainguard.workload.ddp import EXIT_OK


def test_checkpoint_events_reach_kafka_through_the_agent(kafka: KafkaConfig,
                                                          tmp_path: Path) -> None:
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli.main", "agent", "--node", "node-ckpt",
         "--bootstrap", kafka.bootstrap, "--prefix", kafka.topic_prefix, "--interval-s", "0.5",
         "--metrics-port", "0", "--no-kernel-log", "--gpu", "none",
         "--spool-dir", str(tmp_path / "spool"), "--socket", str(sock)],
        stderr=subprocess.PIPE)
    job = Job("job-ckpt-events", 1, free_port(), tmp_path / "ckpt", tmp_path / "logs", 6, 2)
    env = {"TRAINGUARD_AGENT_SOCKET": str(sock), "TRAINGUARD_BINDING_EPOCH": "4"}
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sock.exists(), "the agent did not bind its step socket"
        assert wait_all(job.launch(env), 120) == [EXIT_OK], job.stderr(0)
        state = job.ckpt / "step-000000000006" / "state.pt"
        raw = bytearray(state.read_bytes())
        raw[-100] ^= 0x80
        state.write_bytes(bytes(raw))
        longer = replace(job, steps=8)
        assert wait_all(longer.launch(env), 120) == [EXIT_OK], job.stderr(0)
        time.sleep(1.5)  # the agent publishes as reports arrive; let the last ones out
    finally:
        agent.terminate()
        try:
            agent.communicate(timeout=30)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()

    events = [e for e in read_events(kafka, [TopicRole.TASK]) if e.type == "checkpoint"]
    got = [(e.payload.action.value, e.payload.step) for e in events
           if isinstance(e.payload, CheckpointEvent)]
    assert got == [("written", 2), ("written", 4), ("written", 6),
                   ("corrupt", 6), ("verified", 4), ("loaded", 4),
                   ("written", 6), ("written", 8)]
    g = job.global_batch
    for e in events:
        p = e.payload
        assert isinstance(p, CheckpointEvent)
        assert e.job_id == job.job_id and e.subject is not None
        assert e.subject.rank == 0 and e.subject.node == "node-ckpt"
        assert p.samples_consumed == p.step * g
        assert p.path == str(job.ckpt.resolve() / f"step-{p.step:012d}")
        if p.action.value in ("written", "verified", "loaded"):
            assert p.sha256 is not None and p.size_bytes and p.size_bytes > 1000
        if p.action.value == "written":
            assert p.write_ms is not None and p.write_ms > 0
    corrupt = next(e.payload for e in events
                   if isinstance(e.payload, CheckpointEvent) and e.payload.action == "corrupt")
    assert corrupt.reason is not None and corrupt.reason.startswith("state.pt: sha256")
