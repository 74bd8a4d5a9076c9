"""Launching ranks of the reference DDP workload (``trainguard.workload.ddp``) as real
processes, and reading their progress logs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard.workload.progress import read_progress


@dataclass(frozen=True)
class Job:
    job_id: str
    world: int
    port: int
    ckpt: Path
    logs: Path
    steps: int
    every: int
    keep: int = 3
    seed: int = 7
    batch: int = 16
    step_ms: float = 0.0
    timeout_s: float = 10.0
    layout: str = "state_pt"  # --ckpt-layout

    @property
    def global_batch(self) -> int:
        return self.batch * self.world

    def progress(self, rank: int) -> Path:
        return self.logs / f"rank-{rank}.jsonl"

    def argv(self, rank: int) -> list[str]:
        return [sys.executable, "-m", "trainguard.workload.ddp", "--job-id", self.job_id,
                "--rank", str(rank), "--world-size", str(self.world), "--master-addr",
                "127.0.0.1", "--master-port", str(self.port), "--ckpt-dir", str(self.ckpt),
                "--allow-tmp-ckpt", "--steps", str(self.steps), "--ckpt-every",
                str(self.every), "--keep", str(self.keep), "--seed", str(self.seed),
                "--batch", str(self.batch), "--step-ms", str(self.step_ms), "--timeout-s",
                str(self.timeout_s), "--cpu", "--progress-file", str(self.progress(rank)),
                "--ckpt-layout", self.layout]

    def launch(self, env: dict[str, str] | None = None) -> list[subprocess.Popen[bytes]]:
        self.logs.mkdir(parents=True, exist_ok=True)
        full = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        procs = []
        for r in range(self.world):
            with open(self.logs / f"rank-{r}.err", "ab") as err:
                procs.append(subprocess.Popen(self.argv(r), env=full,
                                              stdout=subprocess.DEVNULL, stderr=err))
        return procs

    def lines(self, rank: int, kind: str | None = None) -> list[dict[str, Any]]:
        path = self.progress(rank)
        rows = read_progress(path) if path.exists() else []
        return [r for r in rows if kind is None or r["kind"] == kind]

    def stderr(self, rank: int) -> str:
        return (self.logs / f"rank-{rank}.err").read_text(errors="replace")[-3000:]


def wait_all(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float) -> list[int]:
    """Every process's exit code; kills them all and fails if one outlives the deadline."""
    deadline = time.monotonic() + timeout_s
    try:
        return [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        kill_all(procs)
        raise AssertionError(f"ranks still running after {timeout_s} s") from None


def kill_all(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def wait_for_step(job: Job, rank: int, step: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in job.lines(rank, "step")):
            return
        time.sleep(0.05)
    raise AssertionError(f"rank {rank} did not reach step {step} in {timeout_s} s:\n"
                         f"{job.stderr(rank)}")


def after_start(job: Job, rank: int, n: int = -1) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The ``n``-th start line of a rank (default: the last) and the step lines after it."""
    rows = job.lines(rank)
    starts = [i for i, r in enumerate(rows) if r["kind"] == "start"]
    i = starts[n]
    end = starts[n + 1] if n != -1 and n + 1 < len(starts) else len(rows)
    return rows[i], [r for r in rows[i + 1:end] if r["kind"] == "step"]
