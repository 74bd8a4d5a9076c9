"""The baseline freeze: before a drill, the five archives (task, data, resources, recovery,
responsibility), the randomness controls, and a fault-free baseline run's metrics; written as
one JSON archive per scenario run. ``run_baseline`` runs the same job without faults and
reads each rank's loss at each step from the workload's progress logs."""

from __future__ import annotations

import getpass
import hashlib
import itertools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainguard.drills.evidence.model import Baseline
from trainguard.drills.job import THREADS, DrillJob
from trainguard.drills.scenario import Scenario
from trainguard.events.envelope import Event
from trainguard.events.payloads import CheckpointAction, CheckpointEvent, PoolUnit, StepReport

REPO = Path(__file__).resolve().parents[2]


def code_version(repo: Path = REPO) -> dict[str, Any]:
    """The git commit and whether the working tree differs from it (and a hash of the diff)."""
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True,
                                  text=True, timeout=20).stdout
        except (OSError, subprocess.TimeoutExpired):
            return ""
    head = git("rev-parse", "HEAD").strip() or None
    diff = git("diff", "HEAD")
    untracked = git("ls-files", "--others", "--exclude-standard")
    return {"commit": head, "dirty": bool(diff or untracked),
            "diff_sha256": hashlib.sha256((diff + untracked).encode()).hexdigest()
            if diff or untracked else None}


def runtime() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for mod in ("torch", "aiokafka", "faust", "pydantic"):
        try:
            from importlib.metadata import version
            versions[mod] = version(mod if mod != "faust" else "faust-streaming")
        except Exception:
            versions[mod] = None
    return {"python": sys.version.split()[0], "platform": platform.platform(),
            "kernel": platform.release(), "host": socket.gethostname(), "cpus": os.cpu_count(),
            "packages": versions}


def freeze(*, run_id: str, scenario: Scenario, job: DrillJob, job_id: str, spec_text: str,
           ckpt_dir: Path, events: Sequence[Event], signer: str,
           code: Mapping[str, Any], rt: Mapping[str, Any]) -> dict[str, Any]:
    """The five archives from what the running job showed before the fault. Pure."""
    mine = [e for e in events if e.job_id == job_id]
    steps = [e.payload for e in mine if isinstance(e.payload, StepReport)]
    bound = [e.payload for e in mine if isinstance(e.payload, PoolUnit)]
    written = [e.payload for e in mine if isinstance(e.payload, CheckpointEvent)
               and e.payload.action is CheckpointAction.WRITTEN]
    last = max(steps, key=lambda s: (s.step, s.rank), default=None)
    units: dict[str, dict[str, Any]] = {}
    for u in bound:  # the latest state of each unit
        units[u.unit] = {"state": u.state.value, "labels": dict(u.labels), "rank": u.rank,
                         "epoch": u.epoch, "pid": u.pid, "resources": dict(u.resources)}
    user = getpass.getuser()
    return {
        "run_id": run_id,
        "task": {"job_id": job_id, "config_version": hashlib.sha256(
            spec_text.encode()).hexdigest(), "code_version": dict(code), "runtime": dict(rt),
            "workload": "trainguard.workload.ddp (PyTorch DDP, gloo on CPU)",
            "world_size": job.world},
        "data": {"snapshot_id": f"SampleStream(seed={job.seed}, size=4096, features=32, "
                                f"classes=4)",
                 "read_position": {"step": last.step if last else None,
                                   "samples_consumed": last.samples_consumed if last else None},
                 "access_identity": {"uid": os.getuid(), "user": user}},
        "resources": {"units": units,
                      "topology": {u["name"]: u["labels"] for u in job.units()},
                      "quotas": {name: u["resources"].get("quota_pct")
                                 for name, u in units.items()},
                      "scheduling": {str(u.rank): {"unit": u.unit, "epoch": u.epoch,
                                                    "pid": u.pid}
                                     for u in bound if u.state.value == "bound"}},
        "recovery": {"checkpoint_policy": {"every_steps": job.ckpt_every, "keep": job.keep},
                     "location": str(ckpt_dir),
                     "storage": "ext4 on a loop-mounted image (fsfreeze / remount for faults)",
                     "checkpoints_before_fault": [c.step for c in written],
                     "checkpoint_bytes": max((c.size_bytes or 0 for c in written), default=None),
                     "spares": job.spares},
        "responsibility": {"injects": f"trainguard drill run ({user}@{socket.gethostname()})",
                           "observes": "trainguard drill run: the event log (Kafka) and a "
                                       "process-table census",
                           "recovers": "trainguard decide + trainguard actuator (automatic)",
                           "signs_off": signer},
        "randomness": {"seed": job.seed, "data": f"SampleStream seed {job.seed}",
                       "model_init": f"torch.manual_seed({job.seed})",
                       "rng_in_checkpoints": "python, torch (and numpy when imported)"},
        "scenario": {"name": scenario.name, "source": scenario.source, "round": scenario.round},
        "frozen_at": int(time.time() * 1e6),
    }


def baseline_from_progress(lines: Sequence[Mapping[str, Any]]) -> Baseline:
    """Each rank's loss at each step and the median step time, from progress-log lines."""
    losses: dict[tuple[int, int], float] = {}
    times: dict[int, list[float]] = {}
    for ln in lines:
        if ln.get("kind") == "step" and ln.get("loss") is not None:
            losses[(int(ln["rank"]), int(ln["step"]))] = float(ln["loss"])
            times.setdefault(int(ln["rank"]), []).append(float(ln["time"]))
    gaps = [(b - a) * 1000 for ts in times.values() for a, b in itertools.pairwise(ts)]
    return Baseline(losses, statistics.median(gaps) if gaps else None)


def run_baseline(job: DrillJob, root: Path, steps: int, *, timeout_s: float = 600.0) -> Baseline:
    """The same job, fault-free and without the loop, for ``steps`` steps (no step floor, no
    checkpoints: neither changes the arithmetic)."""
    from trainguard.dev.kafka import free_port
    from trainguard.workload.progress import read_progress

    root.mkdir(parents=True, exist_ok=True)
    (root / "ckpt").mkdir(exist_ok=True)
    port = free_port()
    procs = []
    for r in range(job.world):
        argv = [sys.executable, "-m", "trainguard.workload.ddp", "--job-id", "baseline",
                "--rank", str(r), "--world-size", str(job.world), "--master-addr", "127.0.0.1",
                "--master-port", str(port), "--ckpt-dir", str(root / "ckpt"), "--steps",
                str(steps), "--ckpt-every", "0", "--seed", str(job.seed), "--batch",
                str(job.batch), "--timeout-s", "60", "--cpu",
                "--progress-file", str(root / f"rank{r}.jsonl")]
        env = {**os.environ, **THREADS,
               "TRAINGUARD_AGENT_SOCKET": str(root / "no-agent.sock")}
        with open(root / f"rank{r}.log", "ab") as log:
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                          start_new_session=True))
    deadline = time.monotonic() + timeout_s
    try:
        for p in procs:
            p.wait(max(1.0, deadline - time.monotonic()))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    bad = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode != 0]
    if bad:
        raise RuntimeError(f"baseline run failed: ranks/exit codes {bad}; see {root}/rank*.log")
    lines: list[dict[str, Any]] = []
    for r in range(job.world):
        lines += read_progress(root / f"rank{r}.jsonl")
    return baseline_from_progress(lines)


def load_or_run_baseline(job: DrillJob, cache: Path, steps: int) -> tuple[Baseline, Path]:
    """A baseline for this job and code, reused when one was recorded for the same inputs."""
    key = hashlib.sha256(json.dumps({"job": job.to_dict(), "code": code_version()},
                                    sort_keys=True).encode())
    path = cache / f"baseline-{key.hexdigest()[:16]}.json"
    if path.exists():
        cached = Baseline.from_dict(json.loads(path.read_text()))
        if max((s for _, s in cached.losses), default=0) >= steps:
            return cached, path
    run = cache / f"baseline-run-{key.hexdigest()[:16]}"
    if run.exists():
        import shutil
        shutil.rmtree(run)
    base = run_baseline(job, run, steps)
    cache.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(base.to_dict()))
    return base, path
