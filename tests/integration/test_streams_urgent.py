"""The urgent lane on the real broker: a process exit published behind a backlog on its task
partition is decided from its copy on the urgent topic before the worker has read the backlog,
and nothing is decided twice.

The backlog: one job's step reports (8 ranks) with a non-finite loss near its end, all on the
task topic before the worker starts; then a rank's exit. The loss verdict can only come once
the worker has read up to it (it is decided in event-time order); the exit's verdict comes
from its copy, so it is on the verdicts topic first. Without the copy (or with the copy read
behind the backlog) the order is the other way round. Order, not time, is asserted: the
latency itself is `bench.bench_detection`'s."""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import arun
from tests.integration.test_streams_worker import (
    _expected,
    _publish,
    _stop,
    _verdicts,
    _worker,
)
from trainguard.bus.config import KafkaConfig
from trainguard.events import encode
from trainguard.events.envelope import Event
from trainguard.events.payloads import Verdict
from trainguard.rules import synth

JOB = "job-urgent"
RANKS, STEPS, NAN_STEP = 8, 5000, 4900


def _log() -> tuple[list[Event], Event]:
    steps = []
    for e in synth.job_steps(JOB, RANKS, STEPS, noise=0.05, seed=5):
        rep = e.payload
        if rep.rank == 0 and rep.step == NAN_STEP:  # type: ignore[attr-defined]
            e = synth.step_report(JOB, 0, NAN_STEP, e.event_time, 100.0, world=RANKS,
                                  loss=float("nan"))
        steps.append(e)
    exit_ = synth.process_exit(JOB, "node-1", 3, steps[-1].event_time + 50_000, signal=9)
    return steps, exit_


def test_an_exit_behind_a_backlog_is_decided_from_its_copy_first_and_once(
        kafka: KafkaConfig, tmp_path: Path) -> None:
    steps, exit_ = _log()
    # what an engine gives, fed the copy first and then the log in order: the worker must
    # publish the same bytes, each once
    expected = _expected([*steps, exit_], copies_first=True)[JOB]
    arun(_publish(kafka, [*steps, exit_]), timeout_s=180)  # the exit is behind 40k reports

    worker = _worker(kafka, tmp_path / "w")
    try:
        got = arun(_verdicts(kafka, len(expected), limit_s=240), timeout_s=300)
        assert worker.poll() is None, "the worker exited"
    finally:
        _stop(worker)

    mine = [v for v in got if v.job_id == JOB and isinstance(v.payload, Verdict)]
    order = [(v.payload.kind, v.payload.state.value) for v in mine]  # type: ignore[attr-defined]
    assert ("process_exit", "open") in order and ("loss_nonfinite", "open") in order, order
    assert order.index(("process_exit", "open")) < order.index(("loss_nonfinite", "open")), (
        "the exit was decided behind the backlog", order)
    ids = [v.event_id for v in mine]
    assert len(ids) == len(set(ids)), "a verdict was published twice"
    assert not any(v.payload.evidence.get("retracted") for v in mine  # type: ignore[attr-defined]
                   ), order
    assert sorted(encode(v) for v in mine) == sorted(expected)
