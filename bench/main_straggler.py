"""The straggler rule as it was on main before the replay-rate work of issue 14 (a verbatim copy
of trainguard/rules/straggler.py at 8d42978), kept for the side-by-side in bench.bench_rules,
with two later behaviour changes applied as in the rule (2026-12-06: the learning steps count as
over or burst by the judged steps' own test; 2026-12-07: a learned step's level, for the own
rates, is taken by the test as it is then, the normal and its margin), so
tests/unit/test_straggler_identity.py still compares the refactor alone.

Original doc: Straggler: a rank persistently slower than its peers and than its own normal.

Peers are the other ranks of the same job in the same pipeline stage (``pp_stage``; ranks
without one form stage ``-``). Each closed step gives every judged rank one number, its
*log-ratio* ``l = log(compute / median of its peers' compute in that step)``: a job-wide
slowdown moves the peer median too and leaves ``l`` alone; a rank's own speed is a constant
offset. The reasoning behind every threshold is in docs/rules.md ("Straggler").

* **Own normal.** A rank's first ``baseline_steps`` judged steps (after ``warmup_steps``) learn
  its normal ``mu``: the median of their ``l`` (one slow step does not move it), whatever it is
  (never capped: workers 5x apart are each normal at their own speed). Afterwards ``mu`` follows
  slowly (a running mean over ``normal_memory_steps``, each step's pull clipped), frozen while
  the rank is suspect or flagged, so a regression is never learned as normal.
* **Persistent slowness against its own normal** (a sequential test). A step is *over* when
  ``l - mu > log(min_effect_ratio)`` and the rank is ``min_excess_ms`` above what its normal
  predicts. Each rank has its own rate ``q`` of over-steps (learned like ``mu``; its upper
  confidence bound, at least ``over_rate_floor``): that is the job's own step-to-step spread as
  this rank sees it (noise, a slowest rank that moves around). A one-sided CUSUM of the
  log-likelihood ratio of "over in ``persistent_share`` of steps" against "over at its own rate
  ``q``" adds ``log(persistent_share / q)`` per over-step and ``log((1 - persistent_share) /
  (1 - q))`` per other step; the rank is flagged when it reaches ``log(1 / alpha)`` and ``k`` of
  the last ``n`` steps were over. A clean rank needs 4 over-steps (time-to-verdict 4 at 1.2x
  and beyond); a rank that is the slowest one step in four by nature needs ~12 in a row.
* **Slow from the start in a homogeneous stage.** Once at least ``min_peers`` peers have learned
  their normals, a rank whose normal stands above the median of its peers' normals by more
  than ``threshold_ratio`` and by ``outlier_z`` robust z (MAD of the peers' normals, at least
  ``min_sigma``), and that was over its peers in ``k`` of its last ``n`` steps, is flagged: its
  peers agree with each other and it does not. Where normals differ by design the MAD is wide
  and nothing stands out. Stages of fewer ranks are judged against their own history only.
* **Bursts.** A CPU quota throttles a process for the rest of each period once its share is
  spent, so most steps run normally and one in a few stalls (the drills' 2 % quota: a fifth of
  the steps ~100x their peers; the medians untouched). A *burst* is a step at least
  ``burst_ratio`` times what the rank's normal predicts and ``burst_min_excess_ms`` above it.
  Each rank learns its own burst rate; the rank is flagged when its bursts within the last
  ``burst_steps`` steps number at least ``burst_k`` and are that many or more with probability
  below ``burst_alpha`` at its own rate (binomial tail). Bursts by design stay silent.

An open verdict follows the rank: it resolves after ``resolve_windows`` steps whose median over
the last ``n`` steps is within ``resolve_ratio`` of the reference it was flagged against (and at
most ``burst_resolve_max`` bursts left in the span); a further worsening by ``worsen_ratio``
beyond the worst effect seen while open (after a settling span of ``burst_steps`` steps)
resolves it and opens a new one, so a later real regression is never hidden behind an earlier
verdict.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, fields
from typing import Any, cast

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import CheckpointAction, CheckpointEvent, StepReport, VerdictKind
from trainguard.rules import steps
from trainguard.rules.base import Context, Evidence, RuleBase, num
from trainguard.rules.stats import median, median_without
from trainguard.rules.steps import Cell

OWN_NORMAL = "own_normal"
STAGE_NORMAL = "stage_normal"
BURSTS = "bursts"


def stage_of(report: StepReport) -> str:
    return "-" if report.pp_stage is None else str(report.pp_stage)


# a row of a rank's history: log-ratio, its ms, its peers' median ms, the highest effect level
# it is over (-1: none), step, time, burst (1/0), judged (1/0; 0 while the normal is learned)
L, MS, PEER, LEVEL, STEP, TIME, BURST, JUDGED = range(8)


def normal_se(st: RankState) -> float:
    """Since 2026-12-07, as in the rule (``straggler.normal_se``): a bound on the normal's
    standard error for any unimodal noise, sqrt(3) x the deviations' RMS / sqrt(n)."""
    n = math.sqrt(max(st.seen, 1))
    return max(1.2533 * st.spread, math.sqrt(3.0 * st.square)) / n


@dataclass
class RankState:
    """One rank's straggler state (JSON via ``doc``/``from_doc``)."""

    learn: list[float] = field(default_factory=list)  # log-ratios while learning its normal
    normal: float = 0.0  # its own normal log-ratio (valid once learned)
    spread: float = 0.0  # its mean absolute deviation of the log-ratio around the normal
    square: float = 0.0  # mean square of its deviations around the normal (2026-12-07)
    learned: bool = False
    seen: int = 0  # steps learned from since (capped at normal_memory_steps)
    over_rates: list[float] = field(default_factory=list)  # own share of over-steps per level
    burst_rate: float = 0.0  # own share of burst steps
    llr: list[float] = field(default_factory=list)  # per level: the CUSUM of the LLR
    hist: list[list[float]] = field(default_factory=list)  # last burst_steps rows (above)
    bursts: int = 0  # bursts within hist
    first_step: int = -1  # first judged step and its time
    first_time: int = 0
    ref: float = 0.0  # while open: the log-ratio it was flagged against ...
    effect: float = 0.0  # ... and the effect it was opened with
    calm: int = 0  # steps back to normal while open
    open_steps: int = 0  # steps judged since the verdict opened

    def doc(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> RankState:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names})


@dataclass(frozen=True)
class Params:
    """The straggler's checked parameters, typed."""

    threshold_ratio: float
    effect_levels: tuple[float, ...]
    persistent_share: float
    alpha: float
    over_rate_floor: float
    n: int
    k: int
    close_lag_steps: int
    min_peers: int
    min_excess_ms: float
    warmup_steps: int
    baseline_steps: int
    normal_memory_steps: int
    outlier_z: float
    min_sigma: float
    resolve_ratio: float
    resolve_windows: int
    worsen_ratio: float
    burst_ratio: float
    burst_min_excess_ms: float
    burst_steps: int
    burst_k: int
    burst_alpha: float
    burst_resolve_max: int

    @classmethod
    def of(cls, p: dict[str, Any]) -> Params:
        def conv(name: str, kind: str) -> Any:
            v = p[name]
            if kind == "int":
                return int(v)
            if kind.startswith("tuple"):
                return tuple(sorted(float(x) for x in v))
            return float(v)
        return cls(**{f.name: conv(f.name, str(f.type)) for f in fields(cls)})


def null_rate(rate: float, floor: float) -> float:
    """The rate a test takes as a rank's own: what it was seen at, at least ``floor`` (no rank
    is credited with never exceeding), at most 0.5."""
    return min(max(rate, floor), 0.5)


def binomial_tail(count: int, n: int, p: float) -> float:
    """P(X >= count) for X ~ Binomial(n, p)."""
    if count <= 0:
        return 1.0
    total = 0.0
    for i in range(count, n + 1):
        total += math.comb(n, i) * p ** i * (1.0 - p) ** (n - i)
    return total


class MainStragglerRule(RuleBase):
    kinds = frozenset({VerdictKind.STRAGGLER})
    types = frozenset({"step.report", "checkpoint"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.q = Params.of(self.p)
        self.levels = [math.log(x) for x in self.q.effect_levels]
        self.limit = math.log(1.0 / self.q.alpha)
        self.ranks: dict[str, RankState] = {}

    def initial_state(self) -> dict[str, Any]:
        # groups: stage -> step group; node: rank -> node; settle: rank -> reports of a new
        # replica still left out (its warm-up); seen: ranks met so far. Per-rank state lives in
        # ``self.ranks`` (RankState) and is saved under "ranks".
        return {"groups": {}, "node": {}, "settle": {}, "seen": {}}

    def snapshot(self) -> dict[str, Any]:
        state = dict(self.s)
        state["ranks"] = {r: st.doc() for r, st in self.ranks.items()}
        return {"state": state, "open": self.book.doc()}

    def restore(self, state: dict[str, Any]) -> None:
        super().restore(state)
        docs = self.s.pop("ranks", {})
        self.ranks = {r: RankState.from_doc(d) for r, d in docs.items()}

    def rebind(self, rank: str, event: Event) -> list[Event]:
        """A new replica: its normal, rates and statistic start afresh (it runs on another
        unit); its first ``warmup_steps`` closed steps are left out (a fresh process, and its
        neighbours starting at the same time, are no straggling). An open verdict stays open and
        resolves once the new replica is back among its peers."""
        old = self.ranks.pop(rank, None)
        if old is not None and self.book.is_open(f"rank:{rank}"):
            self.ranks[rank] = RankState(ref=old.ref, effect=old.effect, learned=True,
                                         normal=old.ref, over_rates=[0.0] * len(self.levels),
                                         llr=[0.0] * len(self.levels))
        self.s.setdefault("settle", {})[rank] = self.q.warmup_steps
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
            self.s.setdefault("settle", {})[rank] = self.q.warmup_steps
        if event.subject.node is not None:
            self.s["node"][rank] = event.subject.node
        closed = steps.add(group, rank, rep.step, rep.compute_ms, event.event_time,
                           self.q.close_lag_steps)
        out: list[Event] = []
        for step, row in closed:
            out.extend(self._judge(stage, step, row))
        return out

    def _judge(self, stage: str, step: int, row: dict[str, Cell]) -> list[Event]:
        q = self.q
        settle = self.s.get("settle")
        judged: list[str] = []
        for rank in sorted(row):
            if settle and rank in settle:
                settle[rank] -= 1
                if settle[rank] <= 0:
                    del settle[rank]
                continue
            judged.append(rank)
        if len(judged) < 2:
            return []  # no peer: a lone rank is not judged here
        values = sorted(row[r].value for r in judged)
        levels = self.levels
        lowest = levels[0]
        limit = self.limit
        # the stage's own rates per level (the mean over its learned ranks): early on, a
        # rank's own rates rest on a few steps, and no rank is held to less than its stage
        pooled = [0.0] * len(levels)
        learned = [st for r in judged if (st := self.ranks.get(r)) is not None and st.learned]
        if learned:
            for st in learned:
                for j, x in enumerate(st.over_rates):
                    pooled[j] += x
            pooled = [x / len(learned) for x in pooled]
        out: list[Event] = []
        candidates: list[str] = []
        for rank in judged:
            value, time = row[rank].value, int(row[rank].time)
            peer = median_without(values, bisect.bisect_left(values, value))
            if peer <= 0 or value <= 0:
                continue
            st = self.ranks.get(rank)
            if st is None:
                st = self.ranks[rank] = RankState(over_rates=[0.0] * len(levels),
                                                  llr=[0.0] * len(levels))
            if st.first_step < 0:
                st.first_step, st.first_time = step, time
            lr = math.log(value / peer)
            if not st.learned:
                st.learn.append(lr)
                self._push(st, [lr, value, peer, -1.0, step, time, 0.0, 0.0], False)
                if len(st.learn) >= q.baseline_steps:
                    self._learned(st)
                continue
            expected = peer * math.exp(st.normal)
            # the normal rests on `seen` noisy steps: a step is over a level only by more than
            # twice the normal's standard error, so a normal learned a little low from a short
            # history does not make noise look like a straggler
            d = lr - st.normal - 2.0 * normal_se(st)
            level = -1
            if lr > 0.0 and value - expected >= q.min_excess_ms:  # slower than its peers
                for j, lv in enumerate(levels):
                    if d > lv:
                        level = j
            burst = value >= q.burst_ratio * expected and \
                value - expected >= q.burst_min_excess_ms
            key = f"rank:{rank}"
            is_open = self.book.is_open(key)
            # the sequential tests against the rank's own over-rates, one per effect level
            p1 = q.persistent_share
            hit = -1
            for j in range(len(levels)):
                own = st.over_rates[j]
                rate = null_rate(own if own > pooled[j] else pooled[j], q.over_rate_floor)
                gain = math.log(p1 / rate) if level >= j else \
                    math.log((1.0 - p1) / (1.0 - rate))
                st.llr[j] = v = max(0.0, st.llr[j] + gain)
                if v >= limit:
                    hit = j
            self._push(st, [lr, value, peer, float(level), step, time, 1.0 if burst else 0.0,
                            1.0], is_open)
            if is_open:
                out.extend(self._follow(key, rank, st, stage, step, time, len(judged)))
                continue
            recent = st.hist[-q.n:]
            if hit >= 0 and sum(1 for r in recent if r[LEVEL] >= hit) >= q.k:
                first = next(r for r in recent if r[LEVEL] >= hit)
                st.ref, st.effect = st.normal, _recent_effect(st, st.normal, q.n)
                out.extend(self._open(key, rank, st, OWN_NORMAL, int(first[STEP]),
                                      int(first[TIME]), stage, step, time, len(judged)))
                continue
            if st.bursts >= q.burst_k and \
                    binomial_tail(st.bursts, q.burst_steps,
                                  null_rate(st.burst_rate, q.over_rate_floor)) \
                    < q.burst_alpha:
                first = next(r for r in st.hist if r[BURST])
                st.ref, st.effect = st.normal, _recent_effect(st, st.normal, q.n)
                out.extend(self._open(key, rank, st, BURSTS, int(first[STEP]), int(first[TIME]),
                                      stage, step, time, len(judged)))
                continue
            if sum(1 for r in recent if r[L] > lowest) >= q.k:
                candidates.append(rank)
        if candidates:
            out.extend(self._stage_outliers(candidates, judged, stage, step, row))
        return out

    def _learned(self, st: RankState) -> None:
        """The learning steps are done: the normal is their median, the own rates of over-steps
        (per level) and of bursts their shares in them."""
        q = self.q
        st.normal = median(st.learn)
        devs = [x - st.normal for x in st.learn]
        n = len(devs)
        st.spread = sum(abs(d) for d in devs) / n
        st.square = sum(d * d for d in devs) / n
        # since 2026-12-06 (applied here too, as in the rule): counted by the judged steps' test
        rows = [r for r in st.hist if not r[JUDGED]][-n:]
        scale = math.exp(st.normal)
        excess = [r[MS] - r[PEER] * scale for r in rows]
        over = [r[L] - st.normal if r[L] > 0.0 and x >= q.min_excess_ms else -math.inf
                for r, x in zip(rows, excess, strict=True)]
        m = max(len(rows), 1)
        st.over_rates = [sum(1 for d in over if d > lv) / m for lv in self.levels]
        st.burst_rate = sum(1 for r, x in zip(rows, excess, strict=True)
                            if r[MS] >= q.burst_ratio * r[PEER] * scale
                            and x >= q.burst_min_excess_ms) / m
        st.seen = min(n, self.q.normal_memory_steps)
        st.learned = True
        st.learn = []

    def _push(self, st: RankState, row: list[float], frozen: bool) -> None:
        """Append a row; the row leaving the burst span is learned from (the normal and the
        own rates), unless the rank is suspect: flagged, a test above half its limit, or
        bursts enough to count. Learning lags the span so a fault's onset is never learned
        before it is judged."""
        st.hist.append(row)
        if row[BURST]:
            st.bursts += 1
        if len(st.hist) <= self.q.burst_steps:
            return
        old = st.hist.pop(0)
        if old[BURST]:
            st.bursts -= 1
        if frozen or not old[JUDGED] or max(st.llr) > self.limit / 2 \
                or st.bursts >= self.q.burst_k:
            return
        q = self.q
        st.seen = w_n = min(st.seen + 1, q.normal_memory_steps)
        w = 1.0 / w_n
        level = -1  # by the test as it is now: normal and margin (as in the rule, 2026-12-07)
        if old[L] > 0.0 and old[MS] - old[PEER] * math.exp(st.normal) >= q.min_excess_ms:
            d = old[L] - st.normal - 2.0 * normal_se(st)
            for j, lv in enumerate(self.levels):
                if d > lv:
                    level = j
        for j in range(len(st.over_rates)):
            st.over_rates[j] += w * ((1.0 if level >= j else 0.0) - st.over_rates[j])
        st.burst_rate += w * (old[BURST] - st.burst_rate)
        pull = self.levels[0]
        raw = old[L] - st.normal
        dev = min(max(raw, -pull), pull)
        st.normal += w * dev
        st.spread += w * (abs(dev) - st.spread)
        st.square += w * (raw * raw - st.square)

    def _stage_outliers(self, candidates: list[str], judged: list[str], stage: str, step: int,
                        row: dict[str, Cell]) -> list[Event]:
        """Ranks slow from the start: their normal stands out from their stage peers'."""
        q = self.q
        normals = sorted((self.ranks[r].normal, r) for r in judged
                         if r in self.ranks and self.ranks[r].learned)  # (normal, rank)
        if len(normals) - 1 < q.min_peers:
            return []
        values = [m for m, _ in normals]
        # the MAD over the whole stage, the candidate included: a little wider, never narrower
        spread = median([abs(m - median(values)) for m in values])
        out: list[Event] = []
        for rank in candidates:
            st = self.ranks[rank]
            med = median_without(values, bisect.bisect_left(values, st.normal))
            effect = st.normal - med
            # the normal is a mean of `seen` noisy steps: its standard error (sigma ~ 1.25 x
            # the mean absolute deviation, x1.2 for the peers' median's own error) bounds the
            # scale from below, so a noisy job's normals are not told apart by noise
            se = 1.2 * normal_se(st)
            z = 0.6745 * effect / max(spread, q.min_sigma, 0.6745 * se)
            if effect < math.log(q.threshold_ratio) or z < q.outlier_z:
                continue
            recent = st.hist[-q.n:]
            excess = median([r[MS] - r[PEER] * math.exp(med) for r in recent])
            if excess < q.min_excess_ms:
                continue
            st.ref, st.effect = med, _recent_effect(st, med, q.n)
            time = int(row[rank].time)
            out.extend(self._open(f"rank:{rank}", rank, st, STAGE_NORMAL, st.first_step,
                                  st.first_time, stage, step, time, len(judged)))
        return out

    def _open(self, key: str, rank: str, st: RankState, path: str, first_step: int,
              first_time: int, stage: str, step: int, time: int, ranks: int) -> list[Event]:
        st.calm = st.open_steps = 0
        ev = self._evidence(st, stage, step, ranks)
        if path == BURSTS:  # what the job waits for: the means over the burst span
            judged = [r for r in st.hist if r[JUDGED]]
            rank_ms, peer_ms = sum(r[MS] for r in judged), sum(r[PEER] for r in judged)
            ev["ratio"] = num(rank_ms / peer_ms if peer_ms > 0 else float("inf"))
            ev["adjusted_ratio"] = num(rank_ms / peer_ms / math.exp(st.ref)
                                       if peer_ms > 0 else float("inf"))
        ev["path"] = path
        ev["first_anomalous_step"] = int(first_step)
        subject = Subject(rank=int(rank), node=self.s["node"].get(rank))
        return self.book.raise_(key, kind=VerdictKind.STRAGGLER, subject=subject, severity=None,
                                first_time=int(first_time), decided_time=time, evidence=ev)

    def _follow(self, key: str, rank: str, st: RankState, stage: str, step: int, time: int,
                ranks: int) -> list[Event]:
        """An open verdict: resolve once the rank is back, reopen when it markedly worsens."""
        q = self.q
        effect = _recent_effect(st, st.ref, q.n)
        st.open_steps += 1
        if st.open_steps <= q.burst_steps or effect < st.effect + math.log(q.worsen_ratio):
            # settling (the window still fills with the fault), or no marked worsening: the
            # worst effect seen so far is what a worsening is measured against
            st.effect = max(st.effect, effect)
        else:
            ev = self._evidence(st, stage, step, ranks)
            ev["worsened"] = True
            out = self.book.resolve(key, decided_time=time, evidence=ev)
            st.effect = effect
            return out + self._open(key, rank, st, OWN_NORMAL, step, time, stage, step, time,
                                    ranks)
        back = effect < math.log(q.resolve_ratio) and st.bursts <= q.burst_resolve_max
        st.calm = st.calm + 1 if back else 0
        if st.calm < q.resolve_windows:
            return []
        ev = self._evidence(st, stage, step, ranks)
        st.llr, st.calm = [0.0] * len(st.llr), 0
        for r in st.hist:
            r[LEVEL] = -1.0
        return self.book.resolve(key, decided_time=time, evidence=ev)

    def _evidence(self, st: RankState, stage: str, step: int, ranks: int) -> Evidence:
        recent = st.hist[-self.q.n:]
        rank_ms = median([r[MS] for r in recent])
        peer_ms = median([r[PEER] for r in recent])
        ratio = rank_ms / peer_ms if peer_ms > 0 else float("inf")
        baseline = math.exp(st.ref)
        return {"rank_ms": num(rank_ms), "peer_median_ms": num(peer_ms), "ratio": num(ratio),
                "baseline": num(baseline), "adjusted_ratio": num(ratio / baseline),
                "steps_over": sum(1 for r in recent if r[LEVEL] >= 0), "steps": len(recent),
                "llr": num(max(st.llr)), "own_over_rate": num(st.over_rates[0]),
                "bursts": st.bursts, "burst_steps": self.q.burst_steps,
                "peers": ranks - 1, "pp_stage": stage, "step": step}


def _recent_effect(st: RankState, ref: float, n: int) -> float:
    """The median over the last n steps of the rank's log-ratio above ``ref``."""
    return median([r[L] for r in st.hist[-n:]]) - ref
