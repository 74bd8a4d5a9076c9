"""A Hugging Face ``Trainer`` job (examples/hf_train.py: a tiny randomly initialised GPT-2,
2 gloo ranks under torchrun, offline) with ``TrainguardCallback.attach``: step reports
(compute from the DDP comm hook on accelerate's DDP model), heartbeats and the Trainer's
checkpoint events reach a real `trainguard agent`, which publishes them to the real broker,
and a killed rank's exit is seen."""

from __future__ import annotations

import shutil
import tempfile
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

pytest.importorskip("transformers")
pytestmark = pytest.mark.integration
JOB = "tg-hf"


@pytest.fixture
def work() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tghf", dir="/tmp"))  # AF_UNIX: short paths
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_hf_trainer_job_reports_and_a_killed_rank_is_seen(kafka: KafkaConfig,
                                                            work: Path) -> None:
    out = work / "out"
    with running_agent(kafka, work, "node-hf") as sock:
        job = torchrun("hf_train.py", [str(out), "1000000"], sock, work, JOB)
        pid = kill_rank_after(job, 1, (out / "checkpoint-15" / "trainer_state.json").exists,
                              work)
    pub = Published.read(kafka, JOB)

    assert_job_seen(pub, world=2, killed_rank=1, killed_pid=pid, min_steps=10)
    assert pub.written()[:2] == [(0, 5, str(out / "checkpoint-5")),
                                 (0, 10, str(out / "checkpoint-10"))]
    assert all(c.size_bytes and c.write_ms is not None for _, c in pub.checkpoints)
    by_step = {s.step: s.samples_consumed for s in pub.steps if s.rank == 0}
    assert by_step[10] == 10 * 8 * 2  # per-device batch 8 on each of 2 ranks
    assert any(b.phase == "checkpoint" and b.rank == 0 for b in pub.beats)
