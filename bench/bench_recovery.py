"""Kill -> resume on the whole loop, on the reference PyTorch DDP workload: a 4-rank gloo job and
one spare launched by `trainguard actuator`, with the real `trainguard agent` (pidfd exit
detection, step reports), `trainguard streams` (the process_exit rule) and `trainguard decide`.
Rank 3 is killed with SIGKILL; the time to the first step after resume is split into:

  detect      kill -> the process_exit verdict on the bus
  decide      verdict -> the signed migrate command (issued_at)
  fence       accepted -> every old replica confirmed dead and its unit released
  bind        -> every rank launched on its unit at the new epoch (the spare for rank 3)
  restore     -> every rank restored the last valid checkpoint (torch import, rendezvous, load)
  first step  -> the first step after resume (step = checkpoint step + 1)

    .venv/bin/python -m bench.bench_recovery [--steps-ms 100] [--ckpt-every 10]

Target: <= 30 s in all on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml
from aiokafka import AIOKafkaConsumer

from bench._common import bench_broker
from trainguard.actuators import signing, zygote
from trainguard.actuators.jobspec import ddp_job_doc
from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.events import decode
from trainguard.events.envelope import Event
from trainguard.events.errors import ContractError
from trainguard.events.payloads import (
    Command,
    CommandOutcome,
    PoolUnit,
    ProcessExit,
    Verdict,
    VerdictKind,
)
from trainguard.events.topics import TOPIC_SPECS, TopicNames, TopicRole
from trainguard.workload.progress import read_progress

WORLD = 4


def job_spec(tmp: Path, job: str, sock: Path, step_ms: float, ckpt_every: int,
             warm: bool) -> Path:
    doc = ddp_job_doc(job, world_size=WORLD, spares=1, ckpt_dir=tmp / "ckpt",
                      node="bench-node", agent_socket=sock, progress_dir=tmp,
                      ckpt_every=ckpt_every, step_ms=step_ms, warm=warm, allow_tmp_ckpt=True,
                      log_dir=tmp / "logs")
    (tmp / "ckpt").mkdir()
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def progress(tmp: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for r in range(WORLD):
        path = tmp / f"progress-{r}.jsonl"
        if path.exists():
            out.extend(read_progress(path))
    return out


async def read_log(cfg: KafkaConfig) -> list[tuple[int, Event]]:
    names = TopicNames(cfg.topic_prefix)
    roles = (TopicRole.TASK, TopicRole.VERDICTS, TopicRole.COMMANDS, TopicRole.OUTCOMES)
    consumer = AIOKafkaConsumer(*(names.name(r) for r in roles), **cfg.client_kwargs(),
                                group_id=None, auto_offset_reset="earliest",
                                isolation_level="read_committed")
    await consumer.start()
    out: list[tuple[int, Event]] = []
    try:
        while True:
            batch = await consumer.getmany(timeout_ms=3000)
            if not batch:
                break
            for recs in batch.values():
                for r in recs:
                    try:
                        out.append((r.timestamp * 1000, decode(r.value)))
                    except ContractError:  # refused records are the DLQ's; bugs surface
                        continue
    finally:
        await consumer.stop()
    return out


def wait(what: str, cond: Any, limit_s: float, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + limit_s
    while not cond():
        for p in procs:
            if p.poll() is not None:
                raise SystemExit(f"a service exited while waiting for {what}: "
                                 f"{' '.join(map(str, p.args))}")  # type: ignore[arg-type]
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step-ms", type=float, default=100.0)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--cold", action="store_true",
                    help="launch ranks with a fresh interpreter each (default: forked by the "
                         "warm launcher, torch already imported)")
    args = ap.parse_args()
    job = f"bench-{uuid.uuid4().hex[:6]}"
    with bench_broker() as info, tempfile.TemporaryDirectory(prefix="tg-recovery-") as tmp_s:
        tmp = Path(tmp_s)
        cfg = KafkaConfig(bootstrap=info.bootstrap, topic_prefix=f"br{uuid.uuid4().hex[:6]}")
        asyncio.run(ensure_topics(cfg, partitions={s.role: 3 for s in TOPIC_SPECS}))
        sock = tmp / "agent.sock"
        spec = job_spec(tmp, job, sock, args.step_ms, args.ckpt_every, warm=not args.cold)
        command_key, actuator_key = signing.PrivateKey.generate(), signing.PrivateKey.generate()
        key_env = {signing.ENV_KEY: command_key.hex(), signing.ENV_PUB: command_key.public().hex(),
                   signing.ENV_ACTUATOR_KEY: actuator_key.hex(),
                   signing.ENV_ACTUATOR_PUBS: actuator_key.public().hex()}
        env = {**os.environ, **key_env}
        base = [sys.executable, "-m", "trainguard.cli.main"]
        kafka = ["--bootstrap", cfg.bootstrap, "--prefix", cfg.topic_prefix]
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        procs = [
            subprocess.Popen([*base, "agent", *kafka, "--node", "bench-node", "--interval-s",
                              "0.5", "--metrics-port", "0", "--gpu", "none", "--discover",
                              "--no-kernel-log", "--spool-dir", str(tmp / "spool"),
                              "--socket", str(sock)], env=env, **quiet),  # type: ignore[call-overload]
            subprocess.Popen([*base, "streams", *kafka, "--data-dir", str(tmp / "streams")],
                             env=env, **quiet),  # type: ignore[call-overload]
            subprocess.Popen([*base, "decide", *kafka, "--settle-s", "1"], env=env),
        ]
        wait("the agent's socket", sock.exists, 60, procs)
        procs.append(subprocess.Popen([*base, "actuator", *kafka, "--job-spec", str(spec),
                                       "--launch", "--state-dir", str(tmp / "state"),
                                       "--no-cgroups"], env=env))
        try:
            t0 = time.time()
            wait("two checkpoints", lambda: sum(p["kind"] == "checkpoint" and p["rank"] == 0
                                                for p in progress(tmp)) >= 2, 600, procs)
            print(f"[bench] job up and checkpointing after {time.time() - t0:.0f} s")
            victim = next(p["pid"] for p in progress(tmp)
                          if p["kind"] == "start" and p["rank"] == 3)
            time.sleep(args.step_ms / 1000 * 3)
            kill_us = time.time_ns() // 1000
            os.kill(victim, signal.SIGKILL)
            wait("every rank's first step after resume", lambda: len({
                p["rank"] for p in progress(tmp) if p["kind"] == "step" and p["epoch"] == 2})
                == WORLD, 600, procs)
            time.sleep(3)
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
            for z in tmp.glob("logs/zygote-*.sock"):
                zygote.stop(z)
            for p in progress(tmp):
                if p["kind"] == "start":
                    try:
                        os.kill(p["pid"], signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        log = asyncio.run(read_log(cfg))
        report(log, progress(tmp), kill_us, args.cold)


def report(log: list[tuple[int, Event]], prog: list[dict[str, Any]], kill_us: int,
           cold: bool) -> None:
    def first(pred: Any) -> tuple[int, Event]:
        return next((ts, e) for ts, e in sorted(log, key=lambda x: x[0]) if pred(e))

    _, exit_ev = first(lambda e: isinstance(e.payload, ProcessExit) and e.payload.rank == 3)
    v_ts, verdict = first(lambda e: isinstance(e.payload, Verdict)
                          and e.payload.kind is VerdictKind.PROCESS_EXIT and e.subject.rank == 3)
    verdict_us = max(v_ts, verdict.ingest_time or 0)
    _, cmd = first(lambda e: isinstance(e.payload, Command))
    _, accepted = first(lambda e: isinstance(e.payload, CommandOutcome)
                        and e.payload.status.value == "accepted")
    fenced = [e for _, e in log if isinstance(e.payload, PoolUnit)
              and e.payload.state.value == "fenced"]
    bound = [e for _, e in log if isinstance(e.payload, PoolUnit)
             and e.payload.state.value == "bound" and e.payload.epoch == 2]
    assert isinstance(cmd.payload, Command)
    starts = [p for p in prog if p["kind"] == "start" and p["epoch"] == 2]
    steps = [p for p in prog if p["kind"] == "step" and p["epoch"] == 2]
    saved = max(p["step"] for p in prog if p["kind"] == "checkpoint" and p["epoch"] == 1)
    fence_us = max(e.event_time for e in fenced)
    bind_us = max(e.event_time for e in bound)
    restore_us = int(max(p["time"] for p in starts) * 1e6)
    step_us = int(min(p["time"] for p in steps) * 1e6)
    phases = [
        ("detect", kill_us, verdict_us),
        ("decide", verdict_us, cmd.payload.issued_at),
        ("fence", accepted.event_time, fence_us),
        ("bind", fence_us, bind_us),
        ("restore", bind_us, restore_us),
        ("first step", restore_us, step_us),
    ]
    print(f"kill -> first step after resume, DDP {WORLD} ranks (gloo, CPU), rank 3 SIGKILL, "
          f"{'cold launch' if cold else 'warm launcher'}:")
    seen_ms = (exit_ev.event_time - kill_us) / 1000
    accept_ms = (accepted.event_time - cmd.payload.issued_at) / 1000
    print(f"  (process.exit seen by the agent {seen_ms:.0f} ms after the kill; command -> "
          f"accepted {accept_ms:.0f} ms)")
    for name, a, b in phases:
        print(f"  {name:<11} {(b - a) / 1e6:7.2f} s")
    total = (step_us - kill_us) / 1e6
    print(f"  {'total':<11} {total:7.2f} s   (target <= 30 s: "
          f"{'met' if total <= 30 else 'MISSED'})")
    resumed = {p["resumed_from"] for p in starts}
    first_steps = sorted({p["step"] for p in steps})[:1]
    print(f"  resumed from checkpoint step {sorted(resumed)} (last written {saved}); first "
          f"step after resume {first_steps}")


if __name__ == "__main__":
    main()
