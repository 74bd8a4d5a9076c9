"""A real `trainguard agent` process and a torchrun job reporting to it, for the SDK's
integration tests (plain torchrun, Lightning, Hugging Face Trainer): the agent publishes to
the real broker, the tests read back what it published, and a rank can be killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.integration.conftest import read_events
from trainguard.bus.config import KafkaConfig
from trainguard.dev.kafka import free_port
from trainguard.events.envelope import Event
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    Heartbeat,
    ProcessExit,
    StepReport,
)
from trainguard.events.topics import TopicRole

ROOT = Path(__file__).resolve().parents[2]
AGENT_INTERVAL_S = 0.25
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}


@contextmanager
def running_agent(kafka: KafkaConfig, work: Path, node: str) -> Iterator[Path]:
    """`trainguard agent` on its own socket (yielded); stopped by SIGTERM, cleanly."""
    sock = work / "agent.sock"
    with open(work / "agent.log", "wb") as log:
        agent = subprocess.Popen(
            [sys.executable, "-m", "trainguard.cli.main", "agent", "--node", node,
             "--bootstrap", kafka.bootstrap, "--prefix", kafka.topic_prefix, "--interval",
             str(AGENT_INTERVAL_S), "--metrics-port", "0", "--no-kernel-log", "--gpu", "none",
             "--spool-dir", str(work / "spool"), "--socket", str(sock)],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(lambda: sock.exists() or agent.poll() is not None, 60, "the agent's socket")
            assert agent.poll() is None, (work / "agent.log").read_text()[-2000:]
            yield sock
            agent.send_signal(signal.SIGTERM)
            agent.wait(timeout=60)
            assert agent.returncode == 0, (work / "agent.log").read_text()[-2000:]
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()


def wait_for(cond: Callable[[], bool], limit_s: float, what: str) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {limit_s} s waiting for {what}")
        time.sleep(0.1)


def torchrun(script: str, args: Sequence[str], sock: Path, work: Path, job: str,
             nproc: int = 2) -> subprocess.Popen[bytes]:
    """``torchrun --nproc-per-node N --rdzv-id JOB script args`` reporting to ``sock``."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
            str(nproc), "--rdzv-id", job, "--master-port", str(free_port()),
            str(ROOT / "examples" / script), *args]
    env = {**os.environ, **OFFLINE_ENV, "TRAINGUARD_AGENT_SOCKET": str(sock)}
    log = open(work / "torchrun.log", "wb")  # a file: a pipe could fill and block  # noqa: SIM115
    try:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    finally:
        log.close()


def rank_pid(launcher: subprocess.Popen[bytes], rank: int) -> int:
    """The pid of the torchrun worker whose environment says RANK=rank."""
    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if child.environ().get("RANK") == str(rank):
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    raise AssertionError(f"no worker with RANK={rank} under torchrun {launcher.pid}")


def kill_rank_after(launcher: subprocess.Popen[bytes], rank: int, ready: Callable[[], bool],
                    work: Path, limit_s: float = 240) -> int:
    """Once ``ready()``, SIGKILL the worker of ``rank``; wait for torchrun to end the job.
    Returns the killed pid."""
    try:
        wait_for(lambda: ready() or launcher.poll() is not None, limit_s, "the job's progress")
        assert launcher.poll() is None, (work / "torchrun.log").read_text(errors="replace")[-3000:]
        pid = rank_pid(launcher, rank)
        os.kill(pid, signal.SIGKILL)
        launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode != 0  # torchrun saw its worker fail
    return pid


@dataclass(frozen=True)
class Published:
    """What the agent published for one job, by kind."""

    steps: list[StepReport]
    beats: list[Heartbeat]
    checkpoints: list[tuple[int | None, CheckpointEvent]]  # (rank, event)
    exits: list[ProcessExit]

    @classmethod
    def read(cls, kafka: KafkaConfig, job: str) -> Published:
        events: list[Event] = [e for e in read_events(kafka, [TopicRole.TASK])
                               if e.job_id == job]
        return cls(
            steps=[e.payload for e in events if isinstance(e.payload, StepReport)],
            beats=[e.payload for e in events if isinstance(e.payload, Heartbeat)],
            checkpoints=[(e.subject.rank, e.payload) for e in events
                         if isinstance(e.payload, CheckpointEvent)],
            exits=[e.payload for e in events if isinstance(e.payload, ProcessExit)])

    def written(self) -> list[tuple[int | None, int, str]]:
        return sorted((r, c.step, c.path) for r, c in self.checkpoints
                      if c.action is CheckpointAction.WRITTEN)


def assert_job_seen(pub: Published, world: int, killed_rank: int, killed_pid: int,
                    min_steps: int) -> None:
    """Step reports (with the DDP hook's comm figure) and heartbeats from every rank, and
    the killed rank's exit, published by the agent. The tests kill a rank once rank 0 wrote
    the checkpoint of step 15: every rank then had reported at least step 14 (step 15's
    all-reduce needs them all), and rank 0 the checkpoints of steps 5 and 10."""
    for r in range(world):
        seen = [s.step for s in pub.steps if s.rank == r]
        assert seen[:min_steps] == list(range(1, min_steps + 1)), (r, seen[:20])
        assert all(s.world_size == world for s in pub.steps if s.rank == r)
    assert all(s.compute_ms >= 0 and s.comm_ms is not None for s in pub.steps)  # the DDP hook
    assert {b.rank for b in pub.beats} == set(range(world))
    exits = [x for x in pub.exits if x.rank == killed_rank]
    assert [x.pid for x in exits] == [killed_pid], pub.exits
    # torchrun, the parent, may reap the killed worker before the agent reads its status
    assert exits[0].signal in (signal.SIGKILL, None), exits[0]
