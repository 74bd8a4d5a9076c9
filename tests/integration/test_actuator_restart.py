"""Kill the actuator in the middle of a command: the restarted actuator rebuilds the pool and
its used keys from the log and its ledger, finishes the command once from its journal and
does not carry it out again when it is redelivered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import yaml

from tests import keys
from tests.integration.conftest import arun
from tests.integration.test_actuator_commands import KEY, command, outcomes_until
from tests.integration.test_fencing import job_spec, reap
from trainguard.actuators.journal import Journal, commands
from trainguard.bus.config import KafkaConfig
from trainguard.bus.producer import EventProducer
from trainguard.events.payloads import CommandAction, CommandOutcome, OutcomeStatus, PoolUnit
from trainguard.events.payloads import UnitState as US


def write_spec(tmp_path: Path, grace_s: float, warm: bool = False) -> tuple[Path, str]:
    spec = job_spec(tmp_path, world=2, grace_s=grace_s, ignore_term=True, warm=warm)
    doc: dict[str, object] = {
           "job_id": spec.job_id, "world_size": spec.world_size, "command": list(spec.command),
           "units": [{"name": u.name, "cpus": list(u.cpus), "labels": dict(u.labels),
                      **({"rank": u.rank} if u.rank is not None else {})} for u in spec.units],
           "ckpt_dir": str(spec.ckpt_dir), "node": spec.node, "grace_s": grace_s,
           "env": dict(spec.env), "log_dir": str(spec.log_dir)}
    if warm:
        doc["preload"] = list(spec.preload)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, spec.job_id


def start_actuator(kafka: KafkaConfig, spec: Path, state: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **keys.env()}
    return subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli.main", "actuator", "--bootstrap",
         kafka.bootstrap, "--prefix", kafka.topic_prefix, "--job-spec", str(spec), "--launch",
         "--state-dir", str(state), "--no-cgroups"], env=env)


def test_a_restarted_actuator_finishes_an_interrupted_command_once(
        kafka: KafkaConfig, tmp_path: Path) -> None:
    spec, job = write_spec(tmp_path, grace_s=4.0)  # the ranks ignore SIGTERM: a long fence
    first = start_actuator(kafka, spec, tmp_path / "state")
    second: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + 40
        progress = tmp_path / "progress.txt"
        while not (progress.exists() and len(progress.read_text().split()) > 12):
            assert time.monotonic() < deadline, "the job was not launched"
            assert first.poll() is None
            time.sleep(0.2)
        time.sleep(2.0)  # the commands consumer joins its group
        resume = command(job, "k-resume", CommandAction.RESUME, 0, signed_with=KEY)

        async def send() -> list[object]:
            async with EventProducer(kafka) as prod:
                await prod.send(resume)
            got = await outcomes_until(kafka, 0, limit_s=20, done=lambda evs: any(
                isinstance(e.payload, CommandOutcome) for e in evs))  # accepted: fencing
            return [e.payload for e in got]

        seen = arun(send())
        statuses = [p.status for p in seen if isinstance(p, CommandOutcome)]
        assert statuses == [OutcomeStatus.ACCEPTED]
        journal = Journal(tmp_path / "state" / f"commands-{job}.journal")
        while "cmd-k-resume" not in {c.cid for c in commands(journal)}:
            assert time.monotonic() < deadline + 40, "the resume never wrote its intent"
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)  # mid-command: inside the SIGTERM grace
        first.wait(10)
        second = start_actuator(kafka, spec, tmp_path / "state")
        events = arun(outcomes_until(kafka, 1, limit_s=40), timeout_s=60)
        time.sleep(3.0)  # the redelivered command (its offset was never committed) is refused
        events = arun(outcomes_until(kafka, 2, limit_s=40), timeout_s=60)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(20)
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if len(cmd) > 1 and cmd[1] == str(tmp_path / "worker.py"):
                reap(p.pid)
    outcomes = [e.payload for e in events if isinstance(e.payload, CommandOutcome)]
    assert [(o.idempotency_key, o.status) for o in outcomes] == [
        ("k-resume", OutcomeStatus.ACCEPTED), ("k-resume", OutcomeStatus.DONE),
        ("k-resume", OutcomeStatus.REFUSED)]
    assert "finished after an actuator restart" in outcomes[1].detail
    assert "replayed" in outcomes[2].detail
    units = [e.payload for e in events if isinstance(e.payload, PoolUnit)]
    bound = [(u.rank, u.epoch) for u in units if u.state is US.BOUND]
    assert sorted(bound) == [(0, 1), (0, 2), (1, 1), (1, 2)]  # relaunched once, at epoch 2
    spares = [u.unit for u in units if u.state is US.SPARE]
    assert len(spares) == len(set(spares)) == 4  # units registered once, not again on restart
