"""Save on command in a real 2-rank job with no periodic checkpoints: SIGUSR1 to one rank, or
the SAVE_NOW file, makes every rank save after the same step, and the checkpoint commits."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.integration.ddp_support import Job, kill_all, wait_for_step
from trainguard.dev.kafka import free_port


def _committed(job: Job) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in job.ckpt.glob("step-*")
                  if (p / "MANIFEST.json").exists())


def _wait_committed(job: Job, n: int, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = _committed(job)
        if len(got) >= n:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{n} checkpoints not committed in {timeout_s} s: {_committed(job)}")


def test_sigusr1_to_one_rank_and_the_request_file_save_on_every_rank(tmp_path: Path) -> None:
    job = Job("job-cmd", 2, free_port(), tmp_path / "ckpt", tmp_path / "run", 100_000, 0,
              step_ms=50)
    procs = job.launch()
    try:
        wait_for_step(job, 0, 3, timeout_s=120)
        assert _committed(job) == []  # --ckpt-every 0: nothing periodic
        procs[1].send_signal(signal.SIGUSR1)  # one rank only
        first = _wait_committed(job, 1, 30)
        (job.ckpt / "SAVE_NOW").touch()
        both = _wait_committed(job, 2, 30)
        assert not (job.ckpt / "SAVE_NOW").exists()  # consumed once
        time.sleep(0.3)  # let rank 1 write its progress line for the second one
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        kill_all(procs)
    assert first[0] >= 3 and both[1] > both[0]
    for rank in range(2):
        assert [r["step"] for r in job.lines(rank, "checkpoint")] == both
