"""A hung peer (SIGSTOP: no error on any socket) does not hang the job forever: the surviving
gloo rank's collective times out after ``--timeout-s`` and the rank exits 3."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.integration.ddp_support import Job, kill_all, wait_for_step
from trainguard.dev.kafka import free_port
from trainguard.workload.ddp import EXIT_PEER_LOST


def test_a_hung_peer_ends_the_survivor_within_the_timeout(tmp_path: Path) -> None:
    job = Job("job-hang", 2, free_port(), tmp_path / "ckpt", tmp_path / "run", 10_000, 0,
              step_ms=50, timeout_s=4.0)
    procs = job.launch()
    try:
        wait_for_step(job, 0, 3, timeout_s=120)
        procs[1].send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        assert procs[0].wait(timeout=30) == EXIT_PEER_LOST, job.stderr(0)
        waited = time.monotonic() - stopped_at
        assert procs[1].poll() is None  # still there, stopped: nobody noticed but the timeout
    finally:
        kill_all(procs)
    assert job.timeout_s - 0.5 <= waited <= job.timeout_s + 10
    assert "lost a peer" in job.lines(0, "exit")[-1]["reason"]
