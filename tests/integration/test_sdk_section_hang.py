"""Hang by section, end to end on real parts: two ranks of the reference DDP workload (gloo),
one of which sleeps inside ``backward`` of one step (``--stall``) while its heartbeat thread
goes on; their datagrams go through the agent's real step receiver, and the rules replayed
over the resulting events open one ``rank_stuck`` verdict, for that rank, naming ``backward``.
Its peer, waiting in the gradient exchange (``comm``, told by the SDK's StepTimer), is not
flagged. The verdict resolves when the rank leaves the section."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.ddp_support import Job, kill_all
from trainguard.collectors.base import Discrete
from trainguard.collectors.steps import StepReceiver
from trainguard.dev.kafka import free_port
from trainguard.events.codec import make_event
from trainguard.events.payloads import Heartbeat, Section, StepReport, Verdict, VerdictKind
from trainguard.rules import parse_rules, replay

JOB, STALL_RANK, STALL_STEP, STALL_S = "sdk-hang", 1, 20, 30.0
# The default section_hang rule with a short initial bound: the test cannot wait the default
# 5 minutes, and a 30-step run learns few sections (heartbeats are 1 s apart, steps ~0.1 s).
RULES = parse_rules("""
rules:
  - id: section-hang
    kind: section_hang
    severity: critical
    parameters: {initial_ms: 12000, floor_ms: 5000}
""")


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="tghang", dir="/tmp"))  # AF_UNIX: short paths
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_rank_asleep_in_backward_is_stuck_in_backward(sock_dir: Path) -> None:
    sock = sock_dir / "agent.sock"
    job = Job(JOB, 2, free_port(), sock_dir / "ckpt", sock_dir / "logs", steps=30, every=0,
              step_ms=100.0, timeout_s=120.0)
    items: list[Discrete] = []
    with StepReceiver("node-0", sock) as rx:
        procs = _launch(job, sock)
        try:
            deadline = time.monotonic() + 240
            while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
                items += rx.drain().discrete
                time.sleep(0.05)
        finally:
            kill_all(procs)
        items += rx.drain().discrete
    codes = [p.returncode for p in procs]
    assert codes == [0, 0], [job.stderr(r) for r in range(2)]

    beats = [(i.subject.rank, i.payload) for i in items if isinstance(i.payload, Heartbeat)]
    inside = [hb for rank, hb in beats if rank == STALL_RANK
              and hb.section is Section.BACKWARD]
    assert inside, "no heartbeat said the stalled rank was in backward"
    assert any(hb.section is Section.COMM for rank, hb in beats if rank == 0), \
        "the peer never showed it waits in the exchange"
    events = [make_event(i.payload, event_id=f"ev-{n:06d}", job_id=i.job_id,
                         event_time=i.event_time, source="agent", subject=i.subject)
              for n, i in enumerate(items) if isinstance(i.payload, Heartbeat | StepReport)]
    out = replay(sorted(events, key=lambda e: (e.event_time, e.event_id)), RULES, JOB)
    stuck = [e for e in out if isinstance(e.payload, Verdict)
             and e.payload.kind is VerdictKind.RANK_STUCK]
    assert [(e.subject.rank, e.payload.state.value) for e in stuck
            if isinstance(e.payload, Verdict)] == [(STALL_RANK, "open"), (STALL_RANK, "resolved")]
    opened = stuck[0].payload
    assert isinstance(opened, Verdict)
    assert opened.evidence["section"] == "backward"
    assert opened.evidence["peers_waiting_in_comm"] == 1
    stuck_ms = opened.evidence["stuck_ms"]
    assert isinstance(stuck_ms, float | int) and stuck_ms < STALL_S * 1000


def _launch(job: Job, sock: Path) -> list[subprocess.Popen[bytes]]:
    """The job's ranks, the stalled one with ``--stall``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINGUARD_AGENT_SOCKET": str(sock)}
    job.logs.mkdir(parents=True, exist_ok=True)
    procs = []
    for r in range(job.world):
        argv = job.argv(r)
        if r == STALL_RANK:
            argv += ["--stall", f"backward:{STALL_STEP}:{STALL_S}"]
        with open(job.logs / f"rank-{r}.err", "ab") as err:
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err))
    return procs
