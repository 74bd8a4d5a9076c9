"""The loop on real processes and the real broker: verdict -> `trainguard decide` (signed
command) -> `trainguard actuator` (fence, bind, resume) -> the job continues from its last
valid checkpoint.

The ranks here are a light pure-Python job that checkpoints like the reference workload
(atomic write, checksum, resume from the newest valid one at start) so that each test stays
well under 90 s on a shared 2-core machine; bench/bench_recovery.py runs the same loop on the
PyTorch DDP workload with the real agent and streams.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from tests import keys
from tests.integration.conftest import arun, read_events
from tests.integration.test_fencing import reap
from trainguard.actuators import cgroups
from trainguard.bus.config import KafkaConfig
from trainguard.bus.producer import EventProducer
from trainguard.events.clock import now_us
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    Command,
    CommandAction,
    CommandOutcome,
    MigrateParams,
    OutcomeStatus,
    PoolUnit,
    RaiseQuotaParams,
    RestartData,
    Severity,
    UnitState,
    Verdict,
    VerdictState,
)
from trainguard.events.topics import TopicRole
from trainguard.workload.progress import read_progress

WORLD = 4
BATCH = 8
CKPT_EVERY = 5

JOB = r'''
import hashlib, json, os, signal, sys, time
rank, world, ckpt, progress = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
epoch = int(os.environ["TRAINGUARD_BINDING_EPOCH"])
BATCH, EVERY = 8, 5
SAVE_NOW = os.path.join(ckpt, "SAVE_NOW")

def asked(*_):  # save on command: any rank asked, rank 0 saves at its next step
    open(SAVE_NOW, "w").close()

signal.signal(signal.SIGUSR1, asked)

def valid(path):
    try:
        doc = json.load(open(path))
        body = json.dumps(doc["state"], sort_keys=True).encode()
        return doc["state"] if hashlib.sha256(body).hexdigest() == doc["sha256"] else None
    except (OSError, ValueError, KeyError):
        return None

step, pos, resumed = 0, 0, None
for name in sorted(os.listdir(ckpt), reverse=True):
    if name.startswith("step-") and name.endswith(".json"):
        state = valid(os.path.join(ckpt, name))
        if state is not None:
            step, pos, resumed = state["step"], state["samples_consumed"], state["step"]
            break
out = open(progress, "a")
def log(**kw):
    out.write(json.dumps({"rank": rank, "epoch": epoch, "pid": os.getpid(), **kw,
                          "time": time.time()}) + "\n")
    out.flush()
log(kind="start", resumed_from=resumed, samples_consumed=pos)
while True:
    t0 = time.time()
    sum(i * i for i in range(20000))
    step += 1
    pos += BATCH * world
    log(kind="step", step=step, samples_consumed=pos)
    requested = rank == 0 and os.path.exists(SAVE_NOW)
    if rank == 0 and (step % EVERY == 0 or requested):
        if requested:
            os.remove(SAVE_NOW)
        state = {"step": step, "samples_consumed": pos}
        body = json.dumps(state, sort_keys=True).encode()
        tmp = os.path.join(ckpt, f".tmp-{step}")
        with open(tmp, "w") as fh:
            json.dump({"state": state, "sha256": hashlib.sha256(body).hexdigest()}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, os.path.join(ckpt, f"step-{step:09d}.json"))
        log(kind="checkpoint", step=step, samples_consumed=pos, requested=requested)
    time.sleep(max(0.0, 0.1 - (time.time() - t0)))
'''


class Loop:
    """decide + actuator as real processes on one job of WORLD ranks and one spare."""

    def __init__(self, kafka: KafkaConfig, tmp: Path, *, window_s: float = 5.0,
                 use_cgroups: bool = False, outcome_timeout_s: float = 180.0,
                 units: Callable[[str], list[dict[str, Any]]] | None = None) -> None:
        self.kafka, self.tmp = kafka, tmp
        self.job = f"job-{uuid.uuid4().hex[:8]}"
        (tmp / "ckpt").mkdir()
        (tmp / "job.py").write_text(JOB)
        spec = {"job_id": self.job, "world_size": WORLD, "node": "test-node",
                "ckpt_dir": str(tmp / "ckpt"), "grace_s": 2, "log_dir": str(tmp / "logs"),
                "command": ["python", str(tmp / "job.py"), "{rank}", "{world_size}",
                            "{ckpt_dir}", str(tmp / "progress.jsonl")],
                "units": units(self.job) if units else [
                    {"name": f"u{r}", "cpus": [r % 2], "rank": r, "labels": {"rack": "r1"}}
                    for r in range(WORLD)] + [{"name": "spare", "cpus": [1], "labels": {
                        "rack": "r1", "reserved_for": self.job}}]}
        (tmp / "job.yaml").write_text(yaml.safe_dump(spec))
        env = {**os.environ, **keys.env()}
        base = [sys.executable, "-m", "trainguard.cli.main"]
        kafka_args = ["--bootstrap", kafka.bootstrap, "--prefix", kafka.topic_prefix]
        self.procs = [
            subprocess.Popen([*base, "decide", *kafka_args, "--window-s", str(window_s),
                                     "--tier-windows", "2", "--settle-s", "1",
                                     "--quota-pct", "200", "--checkpoint-wait-s", "2",
                                     "--outcome-timeout-s", str(outcome_timeout_s)],
                             env=env),
            subprocess.Popen([*base, "actuator", *kafka_args, "--job-spec",
                                     str(tmp / "job.yaml"), "--launch", "--state-dir",
                                     str(tmp / "state")]
                             + ([] if use_cgroups else ["--no-cgroups"]), env=env),
        ]

    def progress(self) -> list[dict[str, Any]]:
        path = self.tmp / "progress.jsonl"
        return read_progress(path) if path.exists() else []

    def wait_for(self, what: str, cond: Callable[[], bool], limit_s: float) -> None:
        deadline = time.monotonic() + limit_s
        while not cond():
            for name, p in zip(("decide", "actuator"), self.procs, strict=True):
                assert p.poll() is None, f"{name} exited while waiting for {what}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.2)

    def pids(self, epoch: int) -> dict[int, int]:
        return {p["rank"]: p["pid"] for p in self.progress()
                if p["kind"] == "start" and p["epoch"] == epoch}

    def publish_verdict(self, kind: str, rank: int, evidence: dict[str, Any],
                        vid: str | None = None) -> str:
        t = now_us()
        vid = vid or derived_id(kind, self.job, rank, t)
        ev = make_event(Verdict(verdict_id=vid, rule=kind.replace("_", "-"), kind=kind,
                                state=VerdictState.OPEN, severity=Severity.CRITICAL,
                                first_anomalous_time=t, decided_time=t, evidence=evidence),
                        event_id=derived_id("verdict", vid, "open"), job_id=self.job,
                        event_time=t, source="test-streams",
                        subject=Subject(rank=rank, node="test-node"))

        async def send() -> None:
            async with EventProducer(self.kafka) as prod:
                await prod.send(ev)
        arun(send())
        return vid

    def log(self) -> list[Event]:
        events = read_events(self.kafka, [TopicRole.COMMANDS, TopicRole.OUTCOMES], idle_ms=500,
                             limit_s=20)
        return sorted(events, key=lambda e: e.event_time)

    def stop_services(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            p.wait(20)

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        for proc in psutil.process_iter(["cmdline"]):
            cmd = proc.info["cmdline"] or []
            if len(cmd) > 1 and cmd[1] == str(self.tmp / "job.py"):
                reap(proc.pid, 0.5)
        try:
            root, version = cgroups.cpu_controller()
        except cgroups.CgroupError:
            return
        for path in (root / "trainguard").glob(f"{self.job}-*"):
            cgroups.CpuCgroup(path, version).remove()


@pytest.fixture
def loop_factory(kafka: KafkaConfig, tmp_path: Path) -> Iterator[Callable[..., Loop]]:
    made: list[Loop] = []

    def make(**kw: Any) -> Loop:
        made.append(Loop(kafka, tmp_path, **kw))
        return made[-1]
    yield make
    for loop in made:
        loop.close()


def outcomes(events: list[Event]) -> list[tuple[str, str]]:
    return [(e.payload.action.value, e.payload.status.value) for e in events
            if isinstance(e.payload, CommandOutcome)]


def test_a_killed_rank_is_fenced_migrated_and_resumed_from_its_checkpoint(
        loop_factory: Callable[..., Loop]) -> None:
    loop = loop_factory()
    loop.wait_for("the job to checkpoint twice", lambda: sum(
        p["kind"] == "checkpoint" for p in loop.progress()) >= 2, 60)
    old = loop.pids(1)
    assert sorted(old) == list(range(WORLD))
    os.kill(old[3], signal.SIGKILL)  # the fault
    killed_at = time.time()
    # detection, as the process_exit rule reports it
    loop.publish_verdict("process_exit", 3, {"pid": old[3], "exit_code": None, "signal": 9,
                                             "detected_by": "pidfd"})
    loop.wait_for("all ranks resumed at epoch 2", lambda: len({
        p["rank"] for p in loop.progress() if p["epoch"] == 2 and p["kind"] == "step"})
        == WORLD, 45)
    progress = loop.progress()
    before = [p for p in progress if p["epoch"] == 1]
    saved = max(p["step"] for p in before if p["kind"] == "checkpoint")
    saved_pos = next(p["samples_consumed"] for p in before
                     if p["kind"] == "checkpoint" and p["step"] == saved)
    for rank in range(WORLD):
        mine = [p for p in progress if p["rank"] == rank and p["epoch"] == 2]
        start = next(p for p in mine if p["kind"] == "start")
        first = next(p for p in mine if p["kind"] == "step")
        assert start["resumed_from"] == saved, rank  # the last valid checkpoint ...
        assert start["samples_consumed"] == saved_pos
        assert first["step"] == saved + 1  # ... and exactly the next step and data position
        assert first["samples_consumed"] == saved_pos + BATCH * WORLD
        assert start["time"] > killed_at
    for pid in old.values():  # every old replica is gone
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    events = loop.log()
    cmds = [e.payload for e in events if isinstance(e.payload, Command)]
    assert [(c.action, c.tier, c.params.rank) for c in cmds] == [
        (CommandAction.MIGRATE, 2, 3)]
    assert cmds[0].signature and cmds[0].signature.startswith("ed25519:")
    assert outcomes(events) == [("migrate", "accepted"), ("migrate", "done")]
    units = [e.payload for e in events if isinstance(e.payload, PoolUnit)]
    fenced = [u for u in units if u.state is UnitState.FENCED]
    assert sorted(u.rank for u in fenced if u.rank is not None) == list(range(WORLD))
    rank3 = next(u for u in fenced if u.rank == 3)
    assert rank3.unit == "u3" and rank3.released and "already gone" in rank3.released[0]
    bound2 = {u.rank: u.unit for u in units if u.state is UnitState.BOUND and u.epoch == 2}
    assert bound2 == {0: "u0", 1: "u1", 2: "u2", 3: "spare"}
    # the end of the job: `actuator --teardown` fences what is bound, on the record
    new = loop.pids(2)
    loop.stop_services()
    subprocess.run([sys.executable, "-m", "trainguard.cli.main", "actuator", "--bootstrap",
                    loop.kafka.bootstrap, "--prefix", loop.kafka.topic_prefix, "--job-spec",
                    str(loop.tmp / "job.yaml"), "--state-dir", str(loop.tmp / "state"),
                    "--no-cgroups", "--teardown"], check=True, timeout=60,
                   env={**os.environ, **keys.env()})
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                   for pid in new.values())
    last = [e.payload for e in loop.log() if isinstance(e.payload, PoolUnit)]
    torn = {u.unit for u in last if u.state is UnitState.FENCED and u.reason == "teardown"}
    assert torn == {"u0", "u1", "u2", "spare"}


def test_a_throttled_rank_climbs_from_quota_to_migration(
        loop_factory: Callable[..., Loop]) -> None:
    loop = loop_factory(window_s=1.5, use_cgroups=True)
    loop.wait_for("the job to run", lambda: len(loop.pids(1)) == WORLD
                  and len(loop.progress()) > 20, 60)
    victim = loop.pids(1)[2]
    throttle = cgroups.create(f"test-throttle-{uuid.uuid4().hex[:6]}")
    try:
        throttle.add(victim)  # injected outside the unit's own cgroup: tier 1 cannot fix it
        throttle.set_quota_pct(5)
        loop.publish_verdict("straggler", 2, {"ratio": 3.2})
        loop.wait_for("tier 2", lambda: ("migrate", "done") in outcomes(loop.log()), 60)
    finally:
        throttle.remove()
    events = loop.log()
    cmds = [e.payload for e in events if isinstance(e.payload, Command)]
    assert [(c.action, c.tier) for c in cmds] == [(CommandAction.RAISE_QUOTA, 1),
                                                  (CommandAction.CHECKPOINT_NOW, 2),
                                                  (CommandAction.MIGRATE, 2)]
    assert isinstance(cmds[0].params, RaiseQuotaParams) and cmds[0].params.quota_pct == 200
    assert outcomes(events) == [("raise_quota", "accepted"), ("raise_quota", "done"),
                                ("checkpoint_now", "accepted"), ("checkpoint_now", "done"),
                                ("migrate", "accepted"), ("migrate", "done")]
    # the save asked before the migration was made, by the running job, before it was fenced
    save, move = cmds[1], cmds[2]
    saved = [p for p in loop.progress() if p["kind"] == "checkpoint" and p.get("requested")]
    assert saved and save.issued_at / 1e6 <= saved[0]["time"] <= move.issued_at / 1e6
    assert move.issued_at - save.issued_at >= 2 * 1e6  # no checkpoint event here: it waited
    quota = next(e.payload for e in events if isinstance(e.payload, CommandOutcome)
                 and e.payload.action is CommandAction.RAISE_QUOTA
                 and e.payload.status is OutcomeStatus.DONE)
    assert "cpu quota 200%" in quota.detail
    done_quota = quota.finished_at or 0
    migrate = next(c for c in cmds if c.action is CommandAction.MIGRATE)
    assert migrate.issued_at - done_quota >= 2 * 1.5 * 1e6  # M windows after tier 1
    assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == "zombie"
    units = [e.payload for e in events if isinstance(e.payload, PoolUnit)]
    assert any(u.state is UnitState.BOUND and u.rank == 2 and u.unit == "spare" for u in units)



def two_hosts(job: str) -> list[dict[str, Any]]:
    """Ranks 0-1 on host h1, 2-3 on host h2; a spare on h2 and two on h1, all reserved."""
    def unit(name: str, host: str, rank: int | None, cpu: int) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": name, "cpus": [cpu],
                               "labels": {"rack": "r1", "host": host}}
        if rank is None:
            doc["labels"]["reserved_for"] = job
        else:
            doc["rank"] = rank
        return doc
    return ([unit(f"u{r}", "h1" if r < 2 else "h2", r, r % 2) for r in range(WORLD)]
            + [unit("spare-h2", "h2", None, 0), unit("spare-h1a", "h1", None, 0),
               unit("spare-h1b", "h1", None, 1)])


def test_a_lost_host_moves_every_rank_it_held_to_spares_on_another_host(
        loop_factory: Callable[..., Loop]) -> None:
    """Ranks 2-3 share host h2 and die together: one signed migrate moves both to spares on
    h1; the spare on h2 (the nearest) is not used, and u2/u3 stay quarantined."""
    loop = loop_factory(units=two_hosts)
    loop.wait_for("the job to checkpoint twice", lambda: sum(
        p["kind"] == "checkpoint" for p in loop.progress()) >= 2, 60)
    old = loop.pids(1)
    for rank in (2, 3):  # the host goes: both its ranks at once
        os.kill(old[rank], signal.SIGKILL)
    for rank in (2, 3):
        loop.publish_verdict("process_exit", rank, {"pid": old[rank], "exit_code": None,
                                                    "signal": 9, "detected_by": "pidfd"})
    loop.wait_for("all ranks resumed at epoch 2", lambda: len({
        p["rank"] for p in loop.progress() if p["epoch"] == 2 and p["kind"] == "step"})
        == WORLD, 45)
    progress = loop.progress()
    saved = max(p["step"] for p in progress if p["epoch"] == 1 and p["kind"] == "checkpoint")
    starts = [p for p in progress if p["epoch"] == 2 and p["kind"] == "start"]
    assert sorted(p["rank"] for p in starts) == list(range(WORLD))
    assert all(p["resumed_from"] == saved for p in starts)
    events = loop.log()
    cmds = [e.payload for e in events if isinstance(e.payload, Command)]
    assert [(c.action, c.params.ranks, c.params.avoid_domains) for c in cmds
            if isinstance(c.params, MigrateParams)] == [
        (CommandAction.MIGRATE, [2, 3], ["host=h2"])]
    assert len(cmds) == 1
    assert cmds[0].signature and cmds[0].signature.startswith("ed25519:")
    assert outcomes(events) == [("migrate", "accepted"), ("migrate", "done")]
    done = next(e.payload for e in events if isinstance(e.payload, CommandOutcome)
                and e.payload.status is OutcomeStatus.DONE)
    assert isinstance(done.data, RestartData)
    assert done.data.to_units == ["spare-h1a", "spare-h1b"]
    units = [e.payload for e in events if isinstance(e.payload, PoolUnit)]
    bound2 = {u.rank: u.unit for u in units if u.state is UnitState.BOUND and u.epoch == 2}
    assert bound2 == {0: "u0", 1: "u1", 2: "spare-h1a", 3: "spare-h1b"}
    fenced = {u.unit: u.reason for u in units if u.state is UnitState.FENCED}
    assert "quarantined" in fenced["u2"] and "quarantined" in fenced["u3"]
    assert "quarantined" not in fenced["u0"]
    # nothing bound on the lost host after the fault, and its units are not handed out again
    assert not [u for u in units if u.state is UnitState.BOUND and u.epoch == 2
                and u.labels.get("host") == "h2"]
