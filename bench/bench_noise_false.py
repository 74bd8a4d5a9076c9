"""False straggler verdicts per job on healthy noisy jobs, fresh engines (the warm-up, when a
rank's mean rests on few steps, is where a false verdict comes from).

    .venv/bin/python -m bench.bench_noise_false [--seeds N] [--ranks R] [--steps S]

Each cell runs ``--seeds`` healthy jobs (every rank at the same speed, uniform noise of the
size given, ranks split into pipeline stages) through all default rules and counts the jobs
with at least one straggler verdict opened: every one is false. It prints the count, the rate
and its 95 % Wilson upper bound (zero false jobs out of 300 still allows ~1.3 %), for the
straggler rule as it was before issue 14 ("before", bench/legacy_straggler.py) and as it is
("after"), side by side in one run. Nothing is asserted (the target: no false verdict at
+-10 % and +-20 % noise; issue 14).
"""

from __future__ import annotations

import argparse
import math
from contextlib import AbstractContextManager, nullcontext

from bench.legacy import legacy_ruleset, legacy_straggler
from trainguard.events.payloads import Verdict, VerdictKind, VerdictState
from trainguard.rules import RuleEngine, RuleSet, load_default_rules
from trainguard.rules.synth import job_steps

CELLS = [(0.10, 1), (0.10, 2), (0.20, 1), (0.20, 2), (0.25, 1), (0.25, 2)]  # (noise, stages)


def false_job(rules: RuleSet, *, ranks: int, steps: int, noise: float, stages: int,
              seed: int) -> bool:
    """Whether one healthy job drew a straggler verdict."""
    engine = RuleEngine("noise", rules)
    got = []
    for e in job_steps("noise", ranks, steps, noise=noise, seed=seed, stages=stages):
        got += engine.feed(e)
    got += engine.flush()
    return any(isinstance(v.payload, Verdict) and v.payload.state is VerdictState.OPEN
               and v.payload.kind is VerdictKind.STRAGGLER for v in got)


def wilson_upper(k: int, n: int, z: float = 1.96) -> float:
    """The 95 % Wilson score interval's upper end for ``k`` successes in ``n`` trials."""
    p = k / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre + spread) / (1 + z * z / n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=300)
    ap.add_argument("--ranks", type=int, default=12)
    ap.add_argument("--steps", type=int, default=160)
    args = ap.parse_args()
    rules = load_default_rules()
    variants: list[tuple[str, RuleSet, AbstractContextManager[None]]] = [
        ("before", legacy_ruleset(rules), legacy_straggler()), ("after", rules, nullcontext())]
    counts: dict[str, list[int]] = {}
    for label, rs, ctx in variants:
        with ctx:
            counts[label] = [
                sum(false_job(rs, ranks=args.ranks, steps=args.steps, noise=noise,
                              stages=stages, seed=seed) for seed in range(args.seeds))
                for noise, stages in CELLS]
    n = args.seeds
    print(f"healthy jobs with a false straggler verdict ({args.ranks} ranks, {args.steps} "
          f"steps, {n} seeds per cell; rate, 95% upper bound):")
    print(f"  {'noise':>6} {'stages':>6}  {'before':>24}  {'after':>24}")
    for i, (noise, stages) in enumerate(CELLS):
        cells = [f"{counts[label][i]:>4}/{n} {counts[label][i] / n:>6.1%} "
                 f"<={wilson_upper(counts[label][i], n):>6.1%}" for label, _, _ in variants]
        print(f"  {noise:>6.0%} {stages:>6}  {cells[0]:>24}  {cells[1]:>24}")


if __name__ == "__main__":
    main()
