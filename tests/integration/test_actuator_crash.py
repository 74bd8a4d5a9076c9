"""SIGKILL the actuator at each step of a migrate and of a resume (the test-only fault point
``TRAINGUARD_TEST_CRASH_AT``): the restarted actuator finishes the command from its journal,
the job steps again with exactly one live replica per rank, and ``--teardown`` stops every
replica the journal knows. Prints the time from the actuator's restart to the job stepping
again (no timing assert)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests import keys
from tests.integration.conftest import arun
from tests.integration.test_actuator_commands import KEY, command, outcomes_until
from tests.integration.test_actuator_restart import write_spec
from tests.integration.test_fencing import reap
from trainguard.actuators import zygote
from trainguard.actuators.executor import FAULT_ENV, FAULT_POINTS
from trainguard.actuators.journal import Journal, replicas
from trainguard.bus.config import KafkaConfig
from trainguard.bus.producer import EventProducer
from trainguard.events.payloads import CommandAction, CommandOutcome, OutcomeStatus


def actuator(kafka: KafkaConfig, spec: Path, state: Path, *extra: str,
             crash_at: str | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, **keys.env(),  # + the warm job's module
           "PYTHONPATH": f"{spec.parent}:{os.environ.get('PYTHONPATH', '')}"}
    env.pop(FAULT_ENV, None)
    if crash_at is not None:
        env[FAULT_ENV] = crash_at
    return subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli.main", "actuator", "--bootstrap",
         kafka.bootstrap, "--prefix", kafka.topic_prefix, "--job-spec", str(spec),
         "--state-dir", str(state), "--no-cgroups", *extra], env=env)


def workers(tmp_path: Path) -> dict[int, list[int]]:
    """rank -> pids of the live worker processes of this test's job (whatever launched them:
    a replica nobody tracks counts too). Cold: by command line; forked by the warm launcher:
    its live children, each rank by its progress lines (-1: a child that never wrote one)."""
    out: dict[int, list[int]] = {}
    script = str(tmp_path / "worker.py")
    ranks = {pid: rank for rank, _, pid in progress(tmp_path)}
    for p in psutil.process_iter(["cmdline", "status", "ppid"]):
        cmd = p.info["cmdline"] or []
        if p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if len(cmd) > 2 and cmd[1] == script:
            out.setdefault(int(cmd[2]), []).append(p.pid)
        elif "trainguard.actuators.zygote" in cmd and str(tmp_path) in " ".join(cmd):
            for child in p.children():
                try:
                    if child.status() != psutil.STATUS_ZOMBIE:
                        out.setdefault(ranks.get(child.pid, -1), []).append(child.pid)
                except psutil.Error:
                    continue
    return out


def progress(tmp_path: Path) -> list[tuple[int, int, int]]:
    path = tmp_path / "progress.txt"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(int(a), int(b), int(c)) for a, b, c in
            (line.split() for line in lines if len(line.split()) == 3)]


@pytest.mark.parametrize("point", FAULT_POINTS)
@pytest.mark.parametrize("action", [CommandAction.RESUME, CommandAction.MIGRATE])
def test_killed_at_each_step_the_restarted_actuator_finishes_the_command(
        kafka: KafkaConfig, tmp_path: Path, action: CommandAction, point: str) -> None:
    crash_and_recover(kafka, tmp_path, action, point, warm=False)


@pytest.mark.parametrize("point", ["fenced", "launched-1"])
def test_warm_launcher_no_fork_outlives_a_killed_actuator_untracked(
        kafka: KafkaConfig, tmp_path: Path, point: str) -> None:
    """Issue 11 reproduction 4: ranks forked by the warm launcher, the actuator killed between
    fence and launch and in the middle of the launch."""
    crash_and_recover(kafka, tmp_path, CommandAction.MIGRATE, point, warm=True)


def crash_and_recover(kafka: KafkaConfig, tmp_path: Path, action: CommandAction, point: str,
                      warm: bool) -> None:
    spec, job = write_spec(tmp_path, grace_s=0.5, warm=warm)  # the ranks ignore SIGTERM
    state = tmp_path / "state"
    first = actuator(kafka, spec, state, "--launch", crash_at=f"{action.value}:{point}")
    second: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 60
        while {r for r, _, _ in progress(tmp_path)} != {0, 1}:
            assert time.monotonic() < deadline, "the job was not launched"
            assert first.poll() is None
            time.sleep(0.2)
        time.sleep(2.0)  # the commands consumer joins its group
        rank = 1 if action is CommandAction.MIGRATE else 0
        cmd = command(job, f"k-{action.value}", action, rank, signed_with=KEY)

        async def send() -> None:
            async with EventProducer(kafka) as prod:
                await prod.send(cmd)

        arun(send())
        assert first.wait(60) == -signal.SIGKILL  # it died at the fault point
        seen = len(progress(tmp_path))
        t0 = time.monotonic()
        second = actuator(kafka, spec, state)
        stepping: float | None = None
        deadline = time.monotonic() + 60
        while stepping is None:
            assert time.monotonic() < deadline, f"the job never stepped again: {workers(tmp_path)}"
            assert second.poll() is None
            live = workers(tmp_path)
            fresh = {r: {pid for r2, e, pid in progress(tmp_path)[seen:] if r2 == r and e > 1}
                     for r in (0, 1)}
            if all(len(live.get(r, [])) == 1 and live[r][0] in fresh[r] for r in (0, 1)):
                stepping = time.monotonic() - t0
            time.sleep(0.05)
        print(f"\n{action.value} killed at {point}: restart -> stepping again in "
              f"{stepping:.2f} s")
        events = arun(outcomes_until(kafka, 1, limit_s=30, done=lambda evs: any(
            isinstance(e.payload, CommandOutcome) and e.payload.status is OutcomeStatus.DONE
            for e in evs)), timeout_s=45)
        time.sleep(1.0)  # nothing else comes up late
        live = workers(tmp_path)
        assert sorted(live) == [0, 1] and all(len(p) == 1 for p in live.values()), live
        journal = Journal(state / "logs" / "replicas.journal")
        units = {r: next(rec.unit for rec in replicas(journal, job) if rec.pid == p[0])
                 for r, p in live.items()}
        second.send_signal(signal.SIGTERM)
        second.wait(20)
        down = subprocess.run(
            [sys.executable, "-m", "trainguard.cli.main", "actuator", "--bootstrap",
             kafka.bootstrap, "--prefix", kafka.topic_prefix, "--job-spec", str(spec),
             "--state-dir", str(state), "--no-cgroups", "--teardown"],
            env={**os.environ, **keys.env()}, timeout=60)
        assert down.returncode == 0
        assert workers(tmp_path) == {}  # every replica the journal knows is stopped
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(20)
        for pids in workers(tmp_path).values():
            for pid in pids:
                reap(pid)
        zygote.stop(tmp_path / "logs" / f"zygote-{job}.sock")
    done = [e.payload for e in events if isinstance(e.payload, CommandOutcome)
            and e.payload.status is OutcomeStatus.DONE]
    assert done and done[0].idempotency_key == f"k-{action.value}"
    assert units == ({0: "u0", 1: "spare-near"} if action is CommandAction.MIGRATE
                     else {0: "u0", 1: "u1"})
