"""The demo from a clone under /tmp whose path holds a space: the demo's own machinery
(``trainguard.demo.whole_loop``: its job spec, start-up wait, kill, teardown) on the whole
loop, its run directory ``<clone>/.run/demo/<time>`` there. The checkpoints under /tmp are
taken (the demo's job is on this one node), every process argv and env carries the path
with its space, rank 1 killed → the incident recovered, and afterwards nothing is left open:
no incident, no rank, no service, no warm launcher. 2 ranks and 1 spare to stay short."""

from __future__ import annotations

import secrets
import time
from pathlib import Path

import psutil

from trainguard.demo.whole_loop import (
    JOB,
    NODE,
    DemoOutcome,
    end_job,
    fault_incidents,
    kill_and_recover,
    open_incidents,
    settled,
    wait_for_start,
    write_job_spec,
)
from trainguard.dev.kafka import KafkaBroker
from trainguard.dev.paths import SUN_PATH_MAX
from trainguard.drills.logtail import LogTail
from trainguard.drills.stack import LocalStack
from trainguard.events.clock import now_us
from trainguard.events.payloads import IncidentState, PoolUnit

WORLD = 2


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_kill_recovered_from_a_clone_under_tmp_with_a_space(tmp_path: Path) -> None:
    assert str(tmp_path).startswith("/tmp/")
    # deep enough that the sockets under it would not fit a unix socket address
    run_dir = tmp_path / "my clone of trainguard" / ".run" / "demo" / time.strftime(
        "%Y%m%dT%H%M%S")
    assert len(str(run_dir / "ranks" / f"zygote-{JOB}.sock")) > SUN_PATH_MAX
    said: list[str] = []
    out = DemoOutcome(run_dir, f"demo{secrets.token_hex(3)}")
    broker = KafkaBroker(tmp_path / "kafka")  # the demo's broker lives outside the clone
    pids: set[int] = set()
    with LocalStack(run_dir, prefix=out.prefix, node=NODE, broker=broker,
                    say=said.append) as stack:
        stack.start_services(("agent", "streams", "decide", "incidents"))
        spec = write_job_spec(stack, run_dir, world=WORLD)
        tail = LogTail(stack.config("trainguard-demo"), JOB)
        tail.start()
        stack.start_actuator(JOB, spec, launch=True)
        pids |= {s.pid for s in stack.services.values() if s.pid}
        try:
            wait_for_start(stack, tail, run_dir / "ranks", limit_s=180, world=WORLD)
            kill_and_recover(stack, tail, out, said.append, rank=1, world=WORLD)
            argvs = {s.name: s.argv for s in stack.services.values()}
        finally:
            tail.stop()
            pids |= {e.payload.pid for e in tail.events()
                     if isinstance(e.payload, PoolUnit) and e.payload.pid}
            out.ended_at = now_us()
            end_job(stack, spec)
        deadline = time.monotonic() + 60
        while not settled(fault_incidents(stack, out.ended_at)):
            assert time.monotonic() < deadline, fault_incidents(stack, out.ended_at)
            time.sleep(1.0)
        incidents = fault_incidents(stack, out.ended_at)
        left = open_incidents(stack)
    assert list(incidents.values()) == [IncidentState.RECOVERED], (incidents, said[-20:])
    assert not left, left
    assert all(any(" " in a for a in argv) for argv in argvs.values()), argvs
    assert any((run_dir / "ckpt").rglob("*")), "no checkpoint under the path with a space"
    zygote = run_dir / "ranks" / f"zygote-{JOB}.pid"
    if zygote.exists():
        pids.add(int(zygote.read_text().split()[0]))
    still = sorted(p for p in pids if _alive(p))
    assert not still, [(p, psutil.Process(p).cmdline()) for p in still]
