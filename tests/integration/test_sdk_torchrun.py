"""A plain torchrun job with the SDK's few lines (examples/torchrun_train.py, 2 gloo ranks):
the identity comes from torchrun (job id from --rdzv-id, rank, world size); step reports with
compute and comm, heartbeats and checkpoint events reach a real step receiver; a second run
of the same command resumes every rank from the last checkpoint; under a real `trainguard
agent`, a rank killed mid-run is seen (its process.exit)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.sdk_jobs import (
    Published,
    assert_job_seen,
    kill_rank_after,
    running_agent,
    torchrun,
)
from trainguard.bus.config import KafkaConfig
from trainguard.collectors.base import Discrete
from trainguard.collectors.steps import StepReceiver
from trainguard.dev.kafka import free_port
from trainguard.events.payloads import CheckpointAction, CheckpointEvent, Heartbeat, StepReport

ROOT = Path(__file__).resolve().parents[2]
JOB = "tg-torchrun"


@pytest.fixture
def work() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tgtr", dir="/tmp"))  # AF_UNIX: short paths
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _torchrun(work: Path, rx: StepReceiver, steps: int) -> list[Discrete]:
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
            "--nproc-per-node", "2", "--rdzv-id", JOB, "--master-port", str(free_port()),
            str(ROOT / "examples" / "torchrun_train.py"), str(work / "ckpt"), str(steps)]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "TRAINGUARD_AGENT_SOCKET": str(work / "agent.sock")}
    items: list[Discrete] = []
    with open(work / "torchrun.log", "wb") as log:  # a file: a pipe could fill and block
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            items += rx.drain().discrete
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
    items += rx.drain().discrete
    assert proc.returncode == 0, (work / "torchrun.log").read_text(errors="replace")[-3000:]
    return items


def test_a_torchrun_job_reports_checkpoints_and_resumes(work: Path) -> None:
    with StepReceiver("node-0", work / "agent.sock") as rx:
        first = _torchrun(work, rx, 12)
        second = _torchrun(work, rx, 16)

    steps = [(i.subject.rank, i.payload) for i in first if isinstance(i.payload, StepReport)]
    assert {i.job_id for i in first + second} == {JOB}  # the job id from torchrun's --rdzv-id
    assert {(r, p.world_size, p.dp_rank, p.binding_epoch) for r, p in steps} == {
        (0, 2, 0, 0), (1, 2, 1, 0)}
    assert sorted(p.step for r, p in steps if r == 1) == list(range(1, 13))
    assert all(p.compute_ms >= 0 and p.comm_ms is not None for _, p in steps)
    beats = {i.subject.rank for i in first if isinstance(i.payload, Heartbeat)}
    assert beats == {0, 1}
    ckpts = [(i.subject.rank, i.payload) for i in first if isinstance(i.payload, CheckpointEvent)]
    assert [(r, p.step) for r, p in ckpts if p.action is CheckpointAction.WRITTEN] == [
        (0, 5), (0, 10)]

    loaded = sorted((i.subject.rank, i.payload.step) for i in second
                    if isinstance(i.payload, CheckpointEvent)
                    and i.payload.action is CheckpointAction.LOADED)
    assert loaded == [(0, 10), (1, 10)]  # every rank resumed from the last checkpoint
    resumed = sorted(i.payload.step for i in second
                     if isinstance(i.payload, StepReport) and i.subject.rank == 0)
    assert resumed == list(range(11, 17))


def test_a_killed_torchrun_rank_is_seen_by_the_agent(kafka: KafkaConfig, work: Path) -> None:
    """The same script under a real `trainguard agent`: what it publishes to the broker has
    both ranks' steps and heartbeats, and the exit of the rank killed mid-run."""
    ckpt = work / "ckpt"
    job_id = f"{JOB}-kill"

    def three_checkpoints() -> bool:
        return ckpt.is_dir() and sum(1 for p in ckpt.iterdir() if p.is_dir()) >= 3

    with running_agent(kafka, work, "node-tr") as sock:
        job = torchrun("torchrun_train.py", [str(ckpt), "1000000"], sock, work, job_id)
        pid = kill_rank_after(job, 1, three_checkpoints, work)
    pub = Published.read(kafka, job_id)

    assert_job_seen(pub, world=2, killed_rank=1, killed_pid=pid, min_steps=10)
    assert [(r, s) for r, s, _ in pub.written()][:2] == [(0, 5), (0, 10)]
