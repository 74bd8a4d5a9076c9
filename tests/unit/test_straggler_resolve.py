"""An open straggler verdict resolves once the rank is no longer slow the way a step must be
to count against it, even when its own normal was learned a little fast. The drills' r1-slowdown
run of 2026-12-06: rank 1's compute is well under 1 ms, so its normal, learned from 10 noisy
steps, came out at 0.77 of its peers. Throttled, it was flagged by its bursts; the quota raised
(tier 1), it ran at its peers' speed, 1.3 times that normal, and the verdict stayed open until
decide escalated to a migrate: a rank moved though tier 1 had fixed it."""

from __future__ import annotations

import random

import pytest

from trainguard.events.payloads import Verdict, VerdictKind, VerdictState
from trainguard.quality.cases import STEP_US, T0, Speed, generate
from trainguard.rules import load_default_rules, replay

pytestmark = pytest.mark.unit
THROTTLED = range(40, 70)  # rank 2 stalls one step in four here, 100x
LEARNED_FAST = range(0, 40)  # ... and runs at 0.75 of its peers before


def _speed(rank: int, step: int, rng: random.Random) -> float:
    if rank != 2:
        return 1.0
    if step in LEARNED_FAST:
        return 0.75
    return 100.0 if step in THROTTLED and step % 4 == 0 else 1.0


def _verdicts(speed: Speed, base_ms: float) -> list[tuple[VerdictState, int]]:
    """Rank 2's straggler verdicts: (state, the step decided)."""
    events = generate("job", 6, 200, speed, noise=0.1, seed=7, base_ms=base_ms)
    out = replay(events, load_default_rules(), "job")
    return [(v.state, (v.decided_time - T0) // STEP_US) for e in out
            if isinstance(v := e.payload, Verdict) and v.kind is VerdictKind.STRAGGLER
            and e.subject.rank == 2]


def test_a_verdict_resolves_once_the_rank_is_back_at_its_peers_speed() -> None:
    got = _verdicts(_speed, base_ms=0.8)
    assert [s for s, _ in got] == [VerdictState.OPEN, VerdictState.RESOLVED], got
    opened, resolved = got[0][1], got[1][1]
    assert THROTTLED.start <= opened < THROTTLED.stop
    # the last stall leaves the 20-step burst span, then 5 calm steps
    assert resolved <= THROTTLED.stop + 20 + 5 + 2, got


def test_a_rank_still_slower_than_its_peers_by_more_than_the_excess_stays_flagged() -> None:
    """The other side: a rank learned at its peers' speed that stays 1.5x slower on a 100 ms
    step (50 ms over) after its bursts stop is not back."""
    def speed(rank: int, step: int, rng: random.Random) -> float:
        if rank != 2 or step < 40:
            return 1.0
        return 1.5 if step % 4 else 3.0

    got = _verdicts(speed, base_ms=100.0)
    assert got and got[0][0] is VerdictState.OPEN
    assert VerdictState.RESOLVED not in [s for s, _ in got], got

