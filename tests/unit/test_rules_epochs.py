"""Binding epochs: after a remediation the actuator binds a rank's new replica at a higher
epoch (a verified ``pool.unit`` event), the replica reports with it and the job's steps go back
to checkpoint + 1. Stale replicas are ignored, the restart itself raises nothing, and the
verdicts of the replaced rank resolve once the new replica reports. A report's own epoch never
moves the binding: one forged report with a higher epoch changes nothing."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.rules_support import RULES, T0, S, kinds, run
from trainguard.events.codec import encode
from trainguard.events.envelope import Event
from trainguard.events.payloads import CheckpointAction, Verdict
from trainguard.rules import RuleEngine
from trainguard.rules.epochs import EpochGate, Gate
from trainguard.rules.synth import (
    bound,
    checkpoint,
    heartbeat,
    job_steps,
    process_exit,
    step_report,
)

pytestmark = pytest.mark.unit
STEP = 200_000
RANKS = 8


def first_run(steps: int = 60, slow: dict[int, tuple[int, float]] | None = None) -> list[Event]:
    """The job launched at epoch 0 (bound pids 100 + rank)."""
    binds = [bound("j", r, 0, T0 - 1000, pid=100 + r) for r in range(RANKS)]
    return binds + list(job_steps("j", RANKS, steps, noise=0.05, seed=5, slow=slow,
                                  step_us=STEP, start_us=T0,
                                  pids={r: 100 + r for r in range(RANKS)}))


def resumed(from_step: int, steps: int, at: int, epochs: dict[int, int],
            warmup: float = 2.0) -> list[Event]:
    """The job again from ``from_step`` (checkpoint + 1) at time ``at``; rank r at epoch
    ``epochs.get(r, 0)`` (new pids for the rebound ones, bound just before); the first step is
    a slow warm-up."""
    out = [bound("j", r, ep, at - 1000, pid=200 + r) for r, ep in sorted(epochs.items())]
    rng = random.Random(9)
    for i, step in enumerate(range(from_step, from_step + steps)):
        for r in range(RANKS):
            ep = epochs.get(r, 0)
            ms = 100.0 * (warmup if i == 0 else 1.0) * (1 + rng.uniform(-0.05, 0.05))
            out.append(step_report("j", r, step, at + i * STEP + r * 10, ms, world=RANKS,
                                   epoch=ep, pid=(200 + r) if ep else 100 + r))
    return out


def end_of(events: list[Event]) -> int:
    return max(e.event_time for e in events)


def test_gate_admits_rebinds_and_refuses_older_epochs() -> None:
    gate = EpochGate()
    assert gate.check(bound("j", 1, 0, T0, pid=11)) is Gate.ADMIT  # the first binding
    assert gate.check(step_report("j", 1, 5, T0, 1.0, epoch=0, pid=11)) is Gate.ADMIT
    # a rank that reported before its first known binding: that binding is a new replica
    assert gate.check(step_report("j", 2, 5, T0, 1.0, epoch=0, pid=21)) is Gate.ADMIT
    assert gate.check(bound("j", 2, 1, T0, pid=22)) is Gate.REBIND
    # a report claiming a newer epoch is evidence like any other, but moves nothing
    assert gate.check(step_report("j", 1, 6, T0 + 1, 1.0, epoch=1, pid=12)) is Gate.ADMIT
    assert gate.epoch(1) == 0
    assert gate.check(step_report("j", 1, 6, T0 + 1, 1.0, epoch=0, pid=11)) is Gate.ADMIT
    assert gate.check(bound("j", 1, 1, T0 + 1, pid=12)) is Gate.REBIND
    assert gate.check(bound("j", 1, 1, T0 + 1, pid=12)) is Gate.ADMIT  # the same, again
    assert gate.check(bound("j", 1, 0, T0 + 1, pid=11)) is Gate.ADMIT  # older, read late
    assert gate.epoch(1) == 1
    assert gate.check(step_report("j", 1, 7, T0 + 2, 1.0, epoch=1, pid=12)) is Gate.ADMIT
    assert gate.check(step_report("j", 1, 8, T0 + 3, 1.0, epoch=0, pid=11)) is Gate.STALE
    assert gate.check(heartbeat("j", 1, T0 + 4, epoch=0)) is Gate.STALE
    assert gate.check(process_exit("j", "n", 1, T0 + 5, epoch=0, pid=11)) is Gate.STALE
    # an exit without an epoch: stale when its pid was an older replica's
    assert gate.check(process_exit("j", "n", 1, T0 + 6, pid=11)) is Gate.STALE
    assert gate.check(process_exit("j", "n", 1, T0 + 7, pid=12)) is Gate.ADMIT
    # the bound replica of a workload that does not report its epoch: admitted by its pid
    assert gate.check(step_report("j", 1, 9, T0 + 8, 1.0, epoch=0, pid=12)) is Gate.ADMIT
    assert gate.stale == 4
    copy = EpochGate()
    copy.restore(gate.snapshot())
    assert copy.snapshot() == gate.snapshot()


def test_whole_job_restart_from_checkpoint_raises_nothing() -> None:
    # every rank rebound, steps back from 59 to 41, a 30 s gap, a 2x warm-up step, no LOADED
    before = first_run()
    after = resumed(41, 80, end_of(before) + 30 * S, {r: 1 for r in range(RANKS)})
    assert kinds(run(before + after)) == []


def test_one_rank_migrated_with_a_resume_raises_nothing() -> None:
    before = first_run()
    at = end_of(before) + 20 * S
    after = [checkpoint("j", CheckpointAction.LOADED, 40, at - 1)]
    after += resumed(41, 80, at, {3: 1})
    assert kinds(run(before + after)) == []


def test_stale_replica_reports_are_dropped() -> None:
    # rank 3 is moved to a new unit (epoch 1); its old replica, 3x slower, keeps reporting
    before = first_run()
    at = end_of(before) + 5 * S
    after = resumed(41, 80, at, {3: 1})
    ghost = [step_report("j", 3, 41 + i, at + i * STEP + 35, 300.0, world=RANKS, epoch=0,
                         pid=103) for i in range(80)]
    engine = RuleEngine("j", RULES)
    out = [v for e in sorted(before + after + ghost, key=lambda e: (e.event_time, e.event_id))
           for v in engine.feed(e)] + engine.flush()
    assert kinds(out) == []
    assert engine.stats()["stale"] == 80


def test_old_replica_exit_after_rebinding_opens_nothing() -> None:
    before = first_run()
    at = end_of(before) + 5 * S
    after = resumed(41, 40, at, {2: 1})
    fenced = [process_exit("j", "node-0", 2, at + 3 * S, signal=15, epoch=0, pid=102),
              process_exit("j", "node-0", 2, at + 4 * S, signal=9, pid=102)]  # no epoch: pid
    assert kinds(run(before + after + fenced)) == []


def test_exit_verdict_resolves_when_the_new_replica_reports() -> None:
    before = first_run()
    died = end_of(before) + 1000
    ev = process_exit("j", "node-0", 2, died, signal=9, epoch=0, pid=102)
    after = resumed(41, 40, died + 10 * S, {2: 1})
    out = run([*before, ev, *after])
    assert kinds(out) == [("process_exit", "open"), ("process_exit", "resolved")]
    opened, resolved = out
    assert isinstance(resolved.payload, Verdict) and isinstance(opened.payload, Verdict)
    assert resolved.payload.verdict_id == opened.payload.verdict_id
    assert resolved.payload.evidence["binding_epoch"] == 1
    assert resolved.event_time == died + 10 * S + 20  # the new replica's first report


def test_straggler_of_a_replaced_rank_resolves_on_the_healthy_replica() -> None:
    before = first_run(90, slow={3: (30, 1.8)})
    at = end_of(before) + 20 * S
    after = resumed(81, 60, at, {3: 1})
    out = run(before + after)
    assert kinds(out) == [("straggler", "open"), ("straggler", "resolved")]
    assert out[1].event_time >= at and out[1].subject.rank == 3


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 60))
def test_stale_reports_change_no_byte(seed: int, n: int) -> None:
    """Any number of reports, heartbeats and exits of the old replica, at any time after the
    rebinding, with any values: the verdicts are byte-identical to those without them."""
    before = first_run(60, slow={5: (20, 1.7)})
    at = end_of(before) + 5 * S
    after = resumed(41, 60, at, {5: 1, 6: 1})
    rng = random.Random(seed)
    ghost: list[Event] = []
    for _i in range(n):
        rank = rng.choice([5, 6])
        t = at + 1 + rng.randrange(60 * STEP)
        what = rng.randrange(3)
        if what == 0:
            ghost.append(step_report("j", rank, rng.randrange(200), t, rng.uniform(1, 900),
                                     world=RANKS, epoch=0, pid=100 + rank,
                                     loss=rng.choice([None, float("nan"), 50.0])))
        elif what == 1:
            ghost.append(heartbeat("j", rank, t, epoch=0))
        else:
            ghost.append(process_exit("j", "node-0", rank, t, signal=9, epoch=0,
                                      pid=100 + rank))
    clean = [encode(v) for v in run(before + after)]
    assert [encode(v) for v in run(before + after + ghost)] == clean


@pytest.mark.parametrize("bindings", [True, False], ids=["verified-pool", "no-pool-events"])
def test_one_forged_report_with_a_higher_epoch_does_not_silence_the_rank(
        bindings: bool) -> None:
    """Issue 11: one unsigned step report claiming epoch 1 for a straggling rank made every
    real report of it stale, and its straggler verdict disappeared in replay. Epochs now come
    only from verified bindings: the forgery is one more report of the rank (as any forged
    report at the current epoch would be) and moves no epoch; the verdict stands, with or
    without verified bindings, and no real report is dropped."""
    before = first_run(90, slow={3: (30, 1.8)})
    if not bindings:
        before = [e for e in before if e.type != "pool.unit"]
    clean = run(before)
    assert ("straggler", "open") in kinds(clean)
    t = before[len(before) // 4].event_time
    forged = step_report("j", 3, 25, t + 5, 100.0, world=RANKS, epoch=1, pid=99999)
    engine = RuleEngine("j", RULES)
    out = [v for e in sorted([*before, forged], key=lambda e: (e.event_time, e.event_id))
           for v in engine.feed(e)] + engine.flush()
    opened = [v for v in out if isinstance(v.payload, Verdict) and v.payload.kind ==
              "straggler" and v.payload.state.value == "open"]
    assert [v.subject.rank for v in opened] == [3]
    assert engine.stats()["stale"] == 0
    assert engine.gate.epoch(3) == (0 if bindings else None)
