"""The straggler rule as it was before issue 14 (main at d7da321), kept for the benches'
before/after figures only (bench.bench_quality --legacy, bench.bench_rules); not used by trainguard.

Peers are the other ranks of the same job in the same pipeline stage (``pp_stage``; ranks
without one form stage ``-``). Per closed step every rank's rolling mean over
``window_steps`` steps is compared with the median of its peers' rolling means; the ratio is
divided by the rank's learned baseline (its mean ratio over the first ``baseline_steps``
windows, clamped to [1, ``baseline_max_ratio``]; while learning, ``baseline_max_ratio``) so a
rank that is a little slower by nature does not alarm for that alone. Flagged when the
adjusted ratio exceeds ``threshold_ratio`` in ``k`` of the last ``n`` windows; resolved
after ``resolve_windows`` windows below ``resolve_ratio``. A job-wide slowdown moves the peer
median too, so it never flags ranks.

The windows' medians ignore a rank slowed in bursts: a CPU quota throttles a process for the
rest of each period once its share is spent, so most of its steps run normally and one in a few
stalls (the drills' 2 % quota: a fifth of the steps ~100x their peers, the window medians
untouched, the whole job 2.7x slower). So each closed step is also judged alone: a *burst* is a
step at least ``burst_ratio`` times the peers' median of that step and ``burst_min_excess_ms``
above it; ``burst_k`` bursts within the last ``burst_steps`` steps flag the rank too. One
descheduled step on a shared machine is one burst, never enough. Such a verdict resolves only
when the windows are back and at most ``burst_resolve_max`` bursts are left in the span.
"""

from __future__ import annotations

import bisect
from typing import Any, cast

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import CheckpointAction, CheckpointEvent, StepReport, VerdictKind
from trainguard.rules import steps
from trainguard.rules.base import Evidence, RuleBase, num
from trainguard.rules.stats import median_without
from trainguard.rules.steps import Cell


def _push_flag(flags: dict[str, list[Any]], key: str, flag: list[Any], n: int
               ) -> list[list[Any]]:
    """``steps.push_flag`` as it was before its flags were typed: the last ``n`` window flags
    ``[over, time, step]`` of ``key``, a JSON list kept in the state."""
    ring = flags.setdefault(key, [])
    ring.append(flag)
    if len(ring) > n:
        del ring[0]
    return ring


def stage_of(report: StepReport) -> str:
    return "-" if report.pp_stage is None else str(report.pp_stage)


class LegacyStragglerRule(RuleBase):
    types = frozenset({"step.report", "checkpoint"})
    kinds = frozenset({VerdictKind.STRAGGLER})

    def initial_state(self) -> dict[str, Any]:
        # groups: stage -> step group; hist: rank -> window; flags: rank -> last n flags;
        # base: rank -> [ratio sum, count]; calm: rank -> windows below resolve; node: rank;
        # settle: rank -> reports of a new replica still left out (its warm-up); seen: ranks
        # met so far (the job's first replicas warm up too)
        # bursts: rank -> the last burst_steps [burst, time, step]
        return {"groups": {}, "hist": {}, "flags": {}, "base": {}, "calm": {}, "node": {},
                "settle": {}, "seen": {}, "bursts": {}}

    def rebind(self, rank: str, event: Event) -> list[Event]:
        """A new replica: its window, flags and baseline start afresh (it runs on another unit);
        its first ``warmup_steps`` closed steps are left out (a fresh process, and its
        neighbours starting at the same time, are no straggling). An open verdict stays open and
        resolves once the new replica's windows are back among its peers."""
        s = self.s
        for part in ("hist", "flags", "base", "calm", "bursts"):
            s.get(part, {}).pop(rank, None)
        s.setdefault("settle", {})[rank] = int(self.p["warmup_steps"])
        return []

    def feed(self, event: Event) -> list[Event]:
        payload = event.payload
        if type(payload) is CheckpointEvent:
            if payload.action is CheckpointAction.LOADED:
                for group in self.s["groups"].values():
                    steps.reset(group)
            return []
        rep = cast(StepReport, payload)
        stage = stage_of(rep)
        group = self.s["groups"].get(stage)
        if group is None:
            group = self.s["groups"][stage] = steps.new_group()
        rank = str(rep.rank)
        seen = self.s.setdefault("seen", {})
        if rank not in seen:
            seen[rank] = True
            self.s.setdefault("settle", {})[rank] = int(self.p["warmup_steps"])
        if event.subject.node is not None:
            self.s["node"][rank] = event.subject.node
        closed = steps.add(group, rank, rep.step, rep.compute_ms, event.event_time,
                           int(self.p["close_lag_steps"]))
        out: list[Event] = []
        for step, row in closed:
            out.extend(self._judge(stage, step, row))
        return out

    def _judge(self, stage: str, step: int, row: dict[str, Cell]) -> list[Event]:
        p = self.p
        s = self.s
        size = int(p["window_steps"])
        medians: dict[str, float] = {}  # the windows' medians: what opens a verdict
        means: dict[str, float] = {}  # the windows' means: what must be back before it resolves
        hist = s["hist"]
        settle = s.get("settle")
        judged: list[str] = []
        for rank in sorted(row):
            if settle and rank in settle:
                settle[rank] -= 1
                if settle[rank] <= 0:
                    del settle[rank]
                continue
            judged.append(rank)
            got = steps.push_window_stats(hist, rank, row[rank].value, size)
            if got is not None:
                medians[rank], means[rank] = got
        bursts = self._count_bursts(step, row, judged)
        if len(medians) - 1 < int(p["min_peers"]):
            return []
        ordered = sorted(medians.values())
        ordered_means = sorted(means.values())
        threshold = p["threshold_ratio"]
        learn = int(p["baseline_steps"])
        n, k = int(p["n"]), int(p["k"])
        out: list[Event] = []
        for rank, med in medians.items():
            peer_med = median_without(ordered, bisect.bisect_left(ordered, med))
            if peer_med <= 0:
                continue
            ratio = med / peer_med
            baseline = 1.0  # baseline_steps 0: no per-rank baseline
            if learn:
                base = s["base"].get(rank)
                if base is None:
                    base = s["base"][rank] = [0.0, 0]
                if base[1] < learn:  # still learning: forgive as much as it may learn
                    base[0] += ratio
                    base[1] += 1
                    baseline = p["baseline_max_ratio"]
                else:
                    baseline = min(max(base[0] / base[1], 1.0), p["baseline_max_ratio"])
            adj = ratio / baseline
            time = int(row[rank].time)
            over_now = adj > threshold and med - peer_med * baseline > p["min_excess_ms"]
            flags = _push_flag(s["flags"], rank, [over_now, time, step], n)
            key = f"rank:{rank}"
            burst_list = bursts.get(rank, [])
            in_bursts = [b for b in burst_list if b[0]]
            if not self.book.is_open(key):
                over = [f for f in flags if f[0]]
                windowed = bool(flags[-1][0]) and len(over) >= k
                bursty = bool(burst_list) and bool(burst_list[-1][0]) and \
                    len(in_bursts) >= int(p["burst_k"])
                if not (windowed or bursty):
                    continue
                if not windowed:
                    over = in_bursts
                s["calm"][rank] = 0
                ev = _evidence(med, peer_med, baseline, flags, size, len(medians), stage, step)
                ev["first_anomalous_step"] = int(over[0][2])
                ev["bursts"] = len(in_bursts)
                ev["burst_steps"] = len(burst_list)
                subject = Subject(rank=int(rank), node=s["node"].get(rank))
                out.extend(self.book.raise_(key, kind=VerdictKind.STRAGGLER, subject=subject,
                                            severity=None, first_time=int(over[0][1]),
                                            decided_time=time, evidence=ev))
            else:
                mean = means[rank]
                peer_mean = median_without(ordered_means, bisect.bisect_left(ordered_means, mean))
                back = adj < p["resolve_ratio"] and (
                    peer_mean <= 0 or mean / (peer_mean * baseline) < p["resolve_ratio"]) \
                    and len(in_bursts) <= int(p["burst_resolve_max"])
                calm = s["calm"][rank] = s["calm"].get(rank, 0) + 1 if back else 0
                if calm >= int(p["resolve_windows"]):
                    ev = _evidence(med, peer_med, baseline, flags, size, len(medians), stage, step)
                    ev["bursts"] = len(in_bursts)
                    s["flags"][rank] = []
                    out.extend(self.book.resolve(key, decided_time=time, evidence=ev))
        return out

    def _count_bursts(self, step: int, row: dict[str, Cell],
                      judged: list[str]) -> dict[str, list[list[Any]]]:
        """Push this step's burst flag of every judged rank (each against its peers' median of
        this one step); -> rank -> its last ``burst_steps`` flags."""
        p = self.p
        ring = self.s.setdefault("bursts", {})
        if len(judged) - 1 < int(p["min_peers"]):
            return {}
        values = sorted(row[r].value for r in judged)
        out: dict[str, list[list[Any]]] = {}
        for rank in judged:
            value = row[rank].value
            peer = median_without(values, bisect.bisect_left(values, value))
            burst = peer > 0 and value >= p["burst_ratio"] * peer and \
                value - peer >= p["burst_min_excess_ms"]
            out[rank] = _push_flag(ring, rank, [burst, int(row[rank].time), step],
                                        int(p["burst_steps"]))
        return out


def _evidence(med: float, peer_med: float, baseline: float, flags: list[list[Any]],
              size: int, ranks: int, stage: str, step: int) -> Evidence:
    ratio = med / peer_med
    return {"rank_ms": num(med), "peer_median_ms": num(peer_med), "ratio": num(ratio),
            "baseline": num(baseline), "adjusted_ratio": num(ratio / baseline),
            "windows_over": sum(1 for f in flags if f[0]), "windows": len(flags),
            "window_steps": size, "samples_used": size * ranks, "peers": ranks - 1,
            "pp_stage": stage, "step": step}
