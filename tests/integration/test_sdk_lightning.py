"""A PyTorch Lightning DDP job (examples/lightning_train.py: 2 gloo ranks under torchrun)
with ``TrainguardCallback``: step reports (compute from the DDP comm hook), heartbeats and
ModelCheckpoint's checkpoint events reach a real `trainguard agent`, which publishes them to
the real broker, and a killed rank's exit is seen."""

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

pytest.importorskip("lightning")
pytestmark = pytest.mark.integration
JOB = "tg-lightning"


@pytest.fixture
def work() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tgpl", dir="/tmp"))  # AF_UNIX: short paths
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_lightning_ddp_job_reports_and_a_killed_rank_is_seen(kafka: KafkaConfig,
                                                               work: Path) -> None:
    ckpt = work / "ckpt"
    with running_agent(kafka, work, "node-pl") as sock:
        job = torchrun("lightning_train.py", [str(ckpt), "1000000"], sock, work, JOB)
        pid = kill_rank_after(job, 1, (ckpt / "epoch=0-step=15.ckpt").exists, work)
    pub = Published.read(kafka, JOB)

    assert_job_seen(pub, world=2, killed_rank=1, killed_pid=pid, min_steps=10)
    assert pub.written()[:2] == [(0, 5, str(ckpt / "epoch=0-step=5.ckpt")),
                                 (0, 10, str(ckpt / "epoch=0-step=10.ckpt"))]
    assert all(c.size_bytes and c.write_ms is not None for _, c in pub.checkpoints)
    by_step = {s.step: s.samples_consumed for s in pub.steps if s.rank == 0}
    assert by_step[10] == 10 * 32 * 2  # batch 32 on each of 2 ranks
    assert any(b.phase == "checkpoint" and b.rank == 0 for b in pub.beats)
