"""`trainguard streams` with trusted actuator keys, on the real broker: binding epochs come from
the actuator's signed ``pool.unit`` events on the outcomes topic; an unsigned one is
dead-lettered by the worker and a report's own epoch moves nothing.

Job: 6 ranks bound at epoch 1 (signed), rank 3 twice as slow from step 20. A ghost replica of
rank 2 (epoch 0, another pid) reports 3x slow steps; a forger adds a step report of rank 3 at
epoch 2 and an unsigned binding of rank 3 at epoch 2. With the verified bindings the ghost is
stale, the forged report moves no epoch and rank 3's straggler verdict opens; without them
(checked offline below) the ghost's reports mask it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

from tests import keys
from tests.integration.conftest import arun
from tests.integration.test_actuator_commands import dead_letters
from tests.integration.test_streams_worker import _verdicts
from trainguard.actuators.signing import sign_event
from trainguard.bus.config import KafkaConfig
from trainguard.bus.producer import EventProducer
from trainguard.events.codec import decode
from trainguard.events.envelope import Event
from trainguard.events.payloads import PoolUnit, Verdict
from trainguard.rules import RuleEngine, load_default_rules, synth

JOB = "job-bind"
T0 = 1_700_000_000_000_000


def scenario() -> tuple[list[Event], list[Event], Event]:
    """(signed bindings, task records with the ghost and the forged report, forged binding)"""
    pids = {r: 500 + r for r in range(6)}
    binds = [sign_event(keys.ACTUATOR, synth.bound(JOB, r, 1, T0 - 1000, pid=pids[r]))
             for r in range(6)]
    steps = list(synth.job_steps(JOB, 6, 90, base_ms=100.0, noise=0.05, seed=3,
                                 slow={3: (20, 2.0)}, epoch=1, pids=pids, start_us=T0))
    ghost = [synth.step_report(JOB, 2, s, T0 + s * 200_000 + 35, 300.0, world=6, epoch=0,
                               pid=999) for s in range(20, 90)]
    forged_report = synth.step_report(JOB, 3, 40, T0 + 40 * 200_000 + 37, 100.0, world=6,
                                      epoch=2, pid=4242)
    task = sorted([*steps, *ghost, forged_report], key=lambda e: (e.event_time, e.event_id))
    return binds, task, synth.bound(JOB, 3, 2, T0 + 30 * 200_000, pid=4242)


def opened(events: list[Event]) -> set[tuple[str, int | None]]:
    return {(v.payload.kind, v.subject.rank) for v in events
            if isinstance(v.payload, Verdict) and v.payload.state.value == "open"}


def test_the_worker_takes_epochs_from_signed_bindings_only(kafka: KafkaConfig,
                                                          tmp_path: Path) -> None:
    binds, task, forged = scenario()
    without = RuleEngine(JOB, load_default_rules())
    assert opened([v for e in task for v in without.feed(e)] + without.flush()) == set()

    worker = subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli.main", "streams", "--bootstrap", kafka.bootstrap,
         "--prefix", kafka.topic_prefix, "--data-dir", str(tmp_path / "w")],
        env={**os.environ, **keys.env()},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    async def publish(events: list[Event]) -> None:
        async with EventProducer(kafka) as producer:
            futs = [await producer.enqueue(ev) for ev in events]
            await asyncio.gather(*futs)

    try:
        arun(publish([*binds, forged]))
        time.sleep(2.0)  # the bindings are read before the reports
        arun(publish(task))
        got = arun(_verdicts(kafka, 1, limit_s=90), timeout_s=120)
        letters = arun(dead_letters(kafka, 1))
    finally:
        worker.terminate()
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
    assert ("straggler", 3) in opened(got)
    assert ("straggler", 2) not in opened(got)
    mine = [lt for lt in letters if lt.consumer == "streams.evaluate"]
    assert len(mine) == 1 and mine[0].reason == "payload.signature: pool.unit unsigned (got None)"
    letter = decode(mine[0].original_value()).payload
    assert isinstance(letter, PoolUnit) and letter.epoch == 2 and letter.pid == 4242
