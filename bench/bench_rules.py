"""Rule evaluators: offline replay rate, straggler time-to-verdict, false verdicts on noise.

    .venv/bin/python -m bench.bench_rules
    .venv/bin/python -m bench.bench_rules --levels 1.15,1.3,1.6,2.0 --levels 1.1,1.3,1.6,2.0

Prints figures; nothing is asserted (targets: >= 500k samples/s, <= 5 steps at 1.5x, 0 false
verdicts over 100k rank-steps with +-10% and +-20% noise and with a rotating slowest rank). A
step report is one sample; a telemetry record counts one sample per GPU. Each figure is printed
for the straggler rule as it was before issue 14 ("before", bench/legacy_straggler.py), as it was
on main before the replay-rate work ("main", bench/main_straggler.py: same output, byte for
byte) and as it is ("after"), in the same run. The replay rates of "before" and "main" are
measured with the rules as pure Python (``TRAINGUARD_PURE=1``, in a child process): the code as
it ran before it was compiled; "after" both ways, pure and as built (``./tg setup`` compiles
the rules with mypyc: trainguard/rules/native.py). A side-by-side table of the replay rates
with the ratios after/before (the pre-issue baseline), after/main and compiled/pure follows.
"after" also runs one 2,048-node x 8-GPU job's telemetry through the engine (issue 15's
fleet, records decoded beforehand), pure and compiled.

``--levels L1,L2,...[:M]`` (repeatable) prints only the trade-off the straggler's
``effect_levels`` (and ``min_effect`` M) make, one row per set: time-to-verdict at 1.1-2x,
false verdicts on noise, and the quality suite's precision and recall with the cases it gets
wrong (the suite is what holds a faster level back: real traces drift where the synthetic noise
does not).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext

import orjson

from bench.fleet import fleet_records
from bench.legacy import legacy_ruleset, legacy_straggler, main_straggler
from trainguard.events.codec import decode
from trainguard.events.envelope import Event
from trainguard.events.payloads import NodeTelemetry, StepReport, Verdict
from trainguard.quality.cases import all_cases
from trainguard.quality.score import score_suite
from trainguard.rules import RuleEngine, RuleSet, load_default_rules, native, replay
from trainguard.rules.synth import gpu, job_steps, step_report, telemetry

T0 = 1_700_000_000_000_000
STEP_US = 200_000


def samples(events: list[Event]) -> int:
    n = 0
    for e in events:
        p = e.payload
        n += len(p.gpus) if isinstance(p, NodeTelemetry) else 1
    return n


def mixed_log(ranks: int, steps: int, nodes: int) -> list[Event]:
    """A synchronous job (5 steps/s) plus one 8-GPU telemetry record per node per second."""
    events = list(job_steps("bench", ranks, steps, noise=0.1, step_us=STEP_US, start_us=T0))
    seconds = steps * STEP_US // 1_000_000
    for i in range(seconds):
        for n in range(nodes):
            gpus = [gpu(g, temp=60.0 + (g + i) % 3, power=400.0 + g, util=95.0) for g in range(8)]
            events.append(telemetry("bench", f"n{n}", T0 + i * 1_000_000 + 777 + n, i, gpus))
    return sorted(events, key=lambda e: (e.event_time, e.event_id))


def rate(label: str, events: list[Event], rules: RuleSet, repeats: int = 5) -> float:
    n = samples(events)
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        replay(events, rules, events[0].job_id)
        rates.append(n / (time.perf_counter() - t0))
    r = statistics.median(rates)
    print(f"  {label:<42} {len(events):>7} events {n:>7} samples  {r:>10,.0f} samples/s")
    return r


def only(rules: RuleSet, keep: Callable[[str], bool]) -> RuleSet:
    return RuleSet(tuple(r for r in rules.rules if keep(r.kind)), rules.allowed_lateness_us)


def time_to_verdict(factor: float, rules: RuleSet, seeds: int = 7) -> list[int | None]:
    """Steps from the first slow step to the step whose closing opened the verdict."""
    onset = 60
    out: list[int | None] = []
    for seed in range(seeds):
        events = list(job_steps("ttv", 16, 120, noise=0.1, seed=seed, slow={5: (onset, factor)},
                                step_us=STEP_US, start_us=T0))
        got = None
        for v in replay(events, rules, "ttv"):
            p = v.payload
            if isinstance(p, Verdict) and p.kind == "straggler" and v.subject.rank == 5:
                got = int(str(p.evidence["step"])) - onset + 1
                break
        out.append(got)
    return out


def false_verdicts(rules: RuleSet, events: Iterator[Event]) -> int:
    engine = RuleEngine("noise", rules)
    n = 0
    for e in events:
        n += len(engine.feed(e))
    return n + len(engine.flush())


def noise_steps(noise: float, rank_steps: int = 100_000, ranks: int = 16) -> Iterator[Event]:
    return job_steps("noise", ranks, rank_steps // ranks, noise=noise, seed=11,
                     step_us=STEP_US, start_us=T0)


def rotating_steps(rank_steps: int = 100_000, ranks: int = 16) -> Iterator[Event]:
    """The slowest rank moves: each rank 1.2-1.35x in its own 16-26 % of steps, +-5 % noise."""
    rng = random.Random(12)
    probs = [0.16 + 0.10 * r / (ranks - 1) for r in range(ranks)]
    for step in range(rank_steps // ranks):
        for rank in range(ranks):
            f = rng.uniform(1.2, 1.35) if rng.random() < probs[rank] else 1.0
            yield step_report("noise", rank, step, T0 + step * STEP_US + rank * 10,
                              100.0 * f * (1 + rng.uniform(-0.05, 0.05)), world=ranks)


def snapshot_cost(events: list[Event], rules: RuleSet, reps: int = 50) -> tuple[float, int]:
    """Microseconds for snapshot() + orjson.dumps mid-run (what the faust app pays per event),
    and the size in bytes."""
    engine = RuleEngine(events[0].job_id, rules)
    for e in events[: len(events) // 2]:
        engine.feed(e)
    t0 = time.perf_counter()
    for _ in range(reps):
        raw = orjson.dumps(engine.snapshot())
    return (time.perf_counter() - t0) / reps * 1e6, len(raw)


def variants(rules: RuleSet) -> list[tuple[str, RuleSet, AbstractContextManager[None]]]:
    return [("before", legacy_ruleset(rules), legacy_straggler()),
            ("main", rules, main_straggler()),
            ("after", rules, nullcontext())]


@dataclasses.dataclass(frozen=True)
class Levels:
    """One row of the trade-off: ``effect_levels``, and ``min_effect`` when given."""

    levels: list[float]
    min_effect: float | None = None

    @classmethod
    def parse(cls, text: str) -> Levels:
        levels, _, least = text.partition(":")
        return cls([float(x) for x in levels.split(",")], float(least) if least else None)

    def __str__(self) -> str:
        return f"{self.levels}" + (f" min_effect {self.min_effect}" if self.min_effect else "")


def with_levels(rules: RuleSet, row: Levels) -> RuleSet:
    """``rules`` with the straggler's ``effect_levels`` (and ``min_effect``) replaced."""
    extra = {"effect_levels": row.levels} | (
        {"min_effect": row.min_effect} if row.min_effect else {})
    return RuleSet(tuple(dataclasses.replace(r, params={**r.params, **extra})
                         if r.kind == "straggler" else r for r in rules.rules),
                   rules.allowed_lateness_us, source=f"{rules.source} ({row})")


def levels_table(rules: RuleSet, sets: list[Levels]) -> None:
    print("straggler effect_levels: time-to-verdict (median/max steps, missed of 7; 16 ranks, "
          "+-10% noise), false verdicts per 100k rank-steps, the quality suite")
    for levels in sets:
        rs = with_levels(rules, levels)
        straggler = only(rs, lambda k: k == "straggler")
        cells = []
        for factor in (1.1, 1.15, 1.2, 1.5, 2.0):
            got = time_to_verdict(factor, straggler)
            found = [g for g in got if g is not None]
            med = statistics.median(found) if found else None
            cells.append(f"{factor}x {med}/{max(found) if found else None}"
                         f"/{len(got) - len(found)}")
        fv = [false_verdicts(straggler, ev) for ev in
              (noise_steps(0.1), noise_steps(0.2), rotating_steps())]
        scores, totals = score_suite([c for c in all_cases() if "large" not in c.tags], rs)
        wrong = [f"{s.case.name}: {', '.join(s.false) or 'missed'}" for s in scores
                 if (s.precision, s.recall) != (1.0, 1.0)]
        print(f"  {levels}: " + "  ".join(cells) + f"  | false {fv[0]}/{fv[1]}/{fv[2]}"
              f"  | suite P {totals.precision:.3f} R {totals.recall:.3f}"
              + (f"  wrong: {'; '.join(wrong)}" if wrong else ""))


RATE_NAMES = ("mixed", "step reports", "straggler alone")


def variant_rates(rules: RuleSet, labels: list[str], extra: bool) -> dict[str, list[float]]:
    """The replay rates of the variants named, in this process (compiled or not: ``mode``)."""
    mixed = mixed_log(ranks=32, steps=1500, nodes=4)
    steps_only = [e for e in mixed if isinstance(e.payload, StepReport)]
    tele_only = [e for e in mixed if isinstance(e.payload, NodeTelemetry)]
    rates: dict[str, list[float]] = {}
    for label, rs, ctx in variants(rules):
        if label not in labels:
            continue
        with ctx:
            print(f"[{label}, {native.mode()}] replay rate (all default rules unless said):")
            rates[label] = [
                rate("mixed: 32 ranks + 4 nodes x 8 GPUs", mixed, rs),
                rate("step reports only", steps_only, rs),
                rate("step reports, straggler rule alone", steps_only,
                     only(rs, lambda k: k == "straggler"))]
            if label == "after":
                fleet_rate(rs)
            if label == "after" and extra:
                rate("telemetry only (8 GPUs/record)", tele_only, rs)
                rate("step reports, reorder buffer alone (no rules)", steps_only,
                     only(rs, lambda k: False))
                us, size = snapshot_cost(mixed, rs)
                print(f"  snapshot + orjson.dumps mid-run (mixed job): {us:,.0f} us, "
                      f"{size:,} bytes")
    return rates


def fleet_rate(rules: RuleSet, nodes: int = 2048, seconds: int = 10) -> float:
    """One job of ``nodes`` 8-GPU nodes at 1 Hz through the engine alone (the records decoded
    beforehand): node records/s, best of 2."""
    events = [decode(v) for _, v in fleet_records(nodes, 8, seconds, T0)]
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        replay(events, rules, events[0].job_id)
        best = min(best, time.perf_counter() - t0)
    r = len(events) / best
    print(f"  one job of {nodes} nodes x 8 GPUs, {seconds} s of telemetry, engine alone: "
          f"{r:,.0f} node records/s = {r * 8:,.0f} samples/s")
    return r


def pure_rates(labels: list[str]) -> dict[str, list[float]]:
    """The same variants with the rules run from their sources (``TRAINGUARD_PURE=1``), in a
    child process: the code as it ran before it was compiled."""
    env = {**os.environ, native.PURE_ENV: "1"}
    done = subprocess.run([sys.executable, "-m", "bench.bench_rules", "--rates", ",".join(labels)],
                          env=env, stdout=subprocess.PIPE, text=True, check=True)
    *lines, last = done.stdout.splitlines()
    print("\n".join(lines))
    got: dict[str, list[float]] = orjson.loads(last)
    return got


def rates_table(pure: dict[str, list[float]], here: dict[str, list[float]]) -> None:
    mode = "compiled" if native.mode().startswith("compiled") else "pure"
    print(f"replay rate side by side (samples/s; before and main as pure Python, as they ran; "
          f"after both ways, 'after' here {native.mode()}):")
    print(f"  {'':<18}{'before':>12}{'main':>12}{'after pure':>12}{'after ' + mode:>16}"
          f"{'after/before':>14}{'after/main':>12}{'compiled/pure':>15}")
    for i, n in enumerate(RATE_NAMES):
        bef, mai, apu, aft = (pure["before"][i], pure["main"][i], pure["after"][i],
                              here["after"][i])
        print(f"  {n:<18}{bef:>12,.0f}{mai:>12,.0f}{apu:>12,.0f}{aft:>16,.0f}"
              f"{aft / bef:>13.2f}x{aft / mai:>11.2f}x{aft / apu:>14.2f}x")
    for base in ("before", "main"):
        print(f"replay rate after/{base}: " + ", ".join(
            f"{n} {a / m:.2f}x" for n, a, m in zip(RATE_NAMES, here["after"], pure[base],
                                                         strict=True)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--levels", action="append", default=[],
                    type=Levels.parse,
                    help="only the effect_levels trade-off, for these levels: "
                         "L1,L2,...[:MIN_EFFECT] (repeatable)")
    ap.add_argument("--rates", help=argparse.SUPPRESS)  # the child of pure_rates
    args = ap.parse_args()
    rules = load_default_rules()
    if args.levels:
        levels_table(rules, args.levels)
        return
    if args.rates:
        measured = variant_rates(rules, args.rates.split(","), extra=False)
        print(orjson.dumps(measured).decode())
        return
    t_start = time.perf_counter()
    print(f"rules: {native.mode()}")
    pure = pure_rates(["before", "main", "after"])
    here = variant_rates(rules, ["after"], extra=True)
    rates_table(pure, here)

    for label, rs, ctx in variants(rules):
        if label == "main":
            continue  # its verdicts are the same bytes as after's (test_straggler_identity)
        with ctx:
            print(f"[{label}] straggler time-to-verdict (16 ranks, +-10% noise, 7 seeds; "
                  "steps incl. the first):")
            straggler = only(rs, lambda k: k == "straggler")
            for factor in (1.2, 1.5, 2.0):
                got = time_to_verdict(factor, straggler)
                found = [g for g in got if g is not None]
                med = statistics.median(found) if found else None
                print(f"  {factor:.1f}x: median {med} steps, max {max(found) if found else None}"
                      f", missed {len(got) - len(found)}/{len(got)}  {got}")
            print(f"[{label}] false verdicts per 100k rank-steps (16 ranks, all default rules):")
            print(f"  +-10% noise: {false_verdicts(rs, noise_steps(0.1))}   "
                  f"+-20% noise: {false_verdicts(rs, noise_steps(0.2))}   "
                  f"rotating slowest rank: {false_verdicts(rs, rotating_steps())}")
    print(f"(bench took {time.perf_counter() - t_start:.1f} s)")


if __name__ == "__main__":
    main()
