"""The reference DDP workload on real processes (gloo, CPU): a killed rank ends its peers
(exit 3, bounded by the collective timeout); all ranks restarted resume from the newest valid
checkpoint at its step + 1 and data position, and the loss curve after resume equals an
uninterrupted run's; a corrupt newest checkpoint makes them resume from the previous one.

Tolerance: with fixed seeds on CPU the runs are bit-identical (same weights, optimizer state,
RNG states, data and reduction order); the loss comparison allows 1e-6 absolute."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.integration.ddp_support import Job, after_start, kill_all, wait_all, wait_for_step
from trainguard.dev.kafka import free_port
from trainguard.workload.ddp import EXIT_OK, EXIT_PEER_LOST

LOSS_TOL = 1e-6
STEPS = 14
EVERY = 4


def _newest_committed(ckpt: Path) -> int:
    steps = [int(p.name.split("-")[1]) for p in ckpt.glob("step-*")
             if (p / "MANIFEST.json").exists()]
    return max(steps)


def _losses(job: Job, rank: int, start: int = 0) -> dict[int, float]:
    """step -> loss of one rank, from its ``start``-th run (its first by default)."""
    _, steps = after_start(job, rank, start)
    return {s["step"]: s["loss"] for s in steps}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """An uninterrupted 2-rank run to STEPS, checkpoints every EVERY steps (kept: all)."""
    root = tmp_path_factory.mktemp("reference")
    job = Job("job-ref", 2, free_port(), root / "ckpt", root / "logs", STEPS, EVERY, keep=5)
    assert wait_all(job.launch(), 120) == [EXIT_OK, EXIT_OK], job.stderr(0) + job.stderr(1)
    return job


@pytest.mark.parametrize("layout", ["state_pt", "dcp"])
def test_killed_rank_then_restart_resumes_exactly(tmp_path: Path, reference: Job,
                                                  layout: str) -> None:
    """Either checkpoint layout (dcp: each rank's shard written in the background) resumes
    on the uninterrupted run's curve, bit for bit."""
    job = Job("job-kill", 2, free_port(), tmp_path / "ckpt", tmp_path / "run", STEPS, EVERY,
              step_ms=150, layout=layout)
    procs = job.launch()
    try:
        wait_for_step(job, 1, 10, timeout_s=120)  # past the checkpoint of step 8
        procs[1].send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        assert procs[0].wait(timeout=20) == EXIT_PEER_LOST, job.stderr(0)
        survivor_exit_s = time.monotonic() - killed_at
        assert procs[1].wait(timeout=5) == -signal.SIGKILL
    finally:
        kill_all(procs)
    assert survivor_exit_s < job.timeout_s + 5
    exit_line = job.lines(0, "exit")[-1]
    assert exit_line["code"] == EXIT_PEER_LOST and "lost a peer" in exit_line["reason"]
    ckpt_step = _newest_committed(job.ckpt)
    assert ckpt_step >= 8 and ckpt_step % EVERY == 0
    killed_pids = {job.lines(r, "start")[0]["pid"] for r in range(2)}

    restarted = job.launch()  # all ranks, same command line, same port
    try:
        assert wait_all(restarted, 120) == [EXIT_OK, EXIT_OK], job.stderr(0) + job.stderr(1)
    finally:
        kill_all(restarted)

    g = job.global_batch
    for rank in range(2):
        ref_loss = _losses(reference, rank)
        start, steps = after_start(job, rank)
        assert start["pid"] not in killed_pids
        assert start["resumed_from"] == ckpt_step
        assert start["samples_consumed"] == ckpt_step * g  # the checkpoint's data position
        assert steps[0]["step"] == ckpt_step + 1
        assert steps[0]["samples_consumed"] == ckpt_step * g + g
        assert [s["step"] for s in steps] == list(range(ckpt_step + 1, STEPS + 1))
        assert [s["samples_consumed"] for s in steps] == [
            s * g for s in range(ckpt_step + 1, STEPS + 1)]
        for s in steps:
            assert abs(s["loss"] - ref_loss[s["step"]]) <= LOSS_TOL, (rank, s)
        # and before the kill, the interrupted run followed the same curve
        before = _losses(job, rank, 0)
        assert len(before) >= 10
        assert all(abs(loss - ref_loss[step]) <= LOSS_TOL for step, loss in before.items())


def test_corrupt_newest_checkpoint_resumes_from_the_previous(reference: Job) -> None:
    """The reference's own checkpoints: flip one bit of the newest (step 12), run again to
    STEPS: it resumes from step 8 and repeats the reference's curve from step 9."""
    state = reference.ckpt / "step-000000000012" / "state.pt"
    raw = bytearray(state.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    state.write_bytes(bytes(raw))
    assert wait_all(reference.launch(), 120) == [EXIT_OK, EXIT_OK], reference.stderr(0)
    for rank in range(2):
        first = _losses(reference, rank, 0)
        start, steps = after_start(reference, rank)
        assert start["resumed_from"] == 8
        assert start["checkpoint"].endswith("step-000000000008")
        assert start["samples_consumed"] == 8 * reference.global_batch
        assert [s["step"] for s in steps] == list(range(9, STEPS + 1))
        assert all(abs(s["loss"] - first[s["step"]]) <= LOSS_TOL for s in steps)
    quarantined = [p.name for p in (reference.ckpt / "quarantine").iterdir()]
    assert len(quarantined) == 1 and quarantined[0].startswith("step-000000000012-")
    assert (reference.ckpt / "step-000000000012" / "MANIFEST.json").exists()  # written again
