"""Hardware outlier: a GPU whose temperature, power or SM clock stands apart from the job's
other busy GPUs at similar utilisation (robust z-score: 0.6745 (x - median) / MAD).

The latest sample of every GPU of the job is kept (older than ``stale_ms`` is not used). On each
node's telemetry, robust statistics are computed over the fresh busy GPUs (SM util at least
``min_util_pct``) and each of that node's GPUs within ``util_band_pct`` of the median util is
judged: temperature high (z > threshold), SM clock low (z < -threshold), power either way.
Opened after ``sustain_samples`` outlying samples, resolved after ``clear_samples`` normal ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from trainguard.events.envelope import Event
from trainguard.events.payloads import NodeTelemetry, VerdictKind
from trainguard.rules.base import Context, RuleBase, num
from trainguard.rules.gpu_health import Run, _sustain, gpu_subject, runs_doc, runs_from_doc
from trainguard.rules.stats import mad, median, robust_z

_DIRECTION = {"temperature_c": 1, "sm_clock_mhz": -1, "power_w": 0,
              "memory_temperature_c": 1, "mem_clock_mhz": -1}


class Sample(NamedTuple):
    """A GPU's latest sample (JSON: ``[time, util, metric values...]``)."""

    time: int
    util: float
    values: tuple[float | None, ...]  # the ``metrics`` parameter's, in order

    def doc(self) -> list[Any]:
        return [self.time, self.util, *self.values]

    @classmethod
    def of(cls, doc: list[Any]) -> Sample:
        return cls(int(doc[0]), doc[1], tuple(doc[2:]))


class Bound(NamedTuple):
    """One metric's job-wide statistics: median, scale and the normal range."""

    med: float
    scale: float
    low: float  # -inf: no lower bound
    high: float  # inf: no upper bound


@dataclass(slots=True)
class JobStats:
    """The job-wide statistics last computed and when (event time); JSON via ``doc``."""

    at: int
    util_med: float | None  # None: too few busy GPUs
    bounds: list[Bound | None]
    peers: int

    def doc(self) -> dict[str, Any]:
        return {"at": self.at, "util_med": self.util_med, "bounds": [
            None if b is None else [b.med, b.scale, None if math.isinf(b.low) else b.low,
                                    None if math.isinf(b.high) else b.high]
            for b in self.bounds], "peers": self.peers}

    @classmethod
    def of(cls, doc: dict[str, Any]) -> JobStats:
        return cls(int(doc["at"]), doc["util_med"], [
            None if b is None else Bound(b[0], b[1], -math.inf if b[2] is None else b[2],
                                         math.inf if b[3] is None else b[3])
            for b in doc["bounds"]], int(doc["peers"]))


class HwOutlierRule(RuleBase):
    kinds = frozenset({VerdictKind.HW_OUTLIER})
    types = frozenset({"telemetry.node"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.latest: dict[str, Sample] = {}  # "node/gpu" -> its latest sample
        self.runs: dict[str, Run] = {}  # "node/gpu" -> its sustain counter
        self.stats: JobStats | None = None

    def state_doc(self) -> dict[str, Any]:
        return {"latest": {k: v.doc() for k, v in self.latest.items()},
                "runs": runs_doc(self.runs),
                "stats": None if self.stats is None else self.stats.doc()}

    def load_state(self, doc: dict[str, Any]) -> None:
        """Keys missing (an older layout) take their initial values."""
        self.latest = {str(k): Sample.of(v) for k, v in doc.get("latest", {}).items()}
        self.runs = runs_from_doc(doc.get("runs", {}))
        stats = doc.get("stats")
        self.stats = None if stats is None else JobStats.of(stats)

    def _job_stats(self, t: int, latest: dict[str, Sample], metrics: list[str]
                   ) -> tuple[float, list[Bound | None], int] | None:
        """Median util and per-metric (median, scale, low, high) over the job's busy GPUs,
        recomputed at most every ``recompute_ms`` of event time (kept in the state, so a
        restored engine decides exactly as an uninterrupted one)."""
        p = self.p
        cached = self.stats
        if cached is not None and t - cached.at < p["recompute_ms"] * 1000:
            if cached.util_med is None:
                return None
            return cached.util_med, cached.bounds, cached.peers
        # stale samples leave only when the statistics are recomputed (nothing else reads
        # other GPUs' rows): one sweep per interval, not one per node record
        stale = int(p["stale_ms"] * 1000)
        for key in [k for k, v in latest.items() if t - v.time > stale]:
            del latest[key]
        # medians and MADs do not depend on the order of their inputs: no sort of 16k keys
        busy = [v for v in latest.values() if v.util >= p["min_util_pct"]]
        if len(busy) - 1 < int(p["min_peers"]):
            self.stats = JobStats(t, None, [], 0)
            return None
        util_med = median([v.util for v in busy])
        thr = p["z_threshold"]
        bounds: list[Bound | None] = []
        for i, metric in enumerate(metrics):
            values = [x for v in busy if (x := v.values[i]) is not None]
            if len(values) - 1 < int(p["min_peers"]):
                bounds.append(None)
                continue
            med = median(values)
            scale = max(mad(values, med), p["min_mad_fraction"] * abs(med), 1e-12)
            reach = thr * scale / 0.6745
            d = _DIRECTION.get(metric, 0)
            bounds.append(Bound(med, scale, med - reach if d <= 0 else -math.inf,
                                med + reach if d >= 0 else math.inf))
        self.stats = JobStats(t, util_med, bounds, len(busy) - 1)
        return util_med, bounds, len(busy) - 1

    def feed(self, event: Event) -> list[Event]:
        p = self.p
        node = event.subject.node or "-"
        t = event.event_time
        metrics: list[str] = p["metrics"]
        latest = self.latest
        mine: list[tuple[int, str]] = []
        for g in cast(NodeTelemetry, event.payload).gpus:
            if g.sm_util_pct is None:
                continue
            key = f"{node}/{g.index}"
            latest[key] = Sample(t, g.sm_util_pct, tuple(getattr(g, m) for m in metrics))
            mine.append((g.index, key))
        stats = self._job_stats(t, latest, metrics)
        if stats is None:
            return []
        util_med, bounds, peers = stats
        out: list[Event] = []
        runs = self.runs
        for index, key in mine:
            row = latest[key]
            if row.util < p["min_util_pct"] or abs(row.util - util_med) > p["util_band_pct"]:
                continue
            hits: dict[str, Any] = {}
            for i, b in enumerate(bounds):
                x = row.values[i]
                if b is None or x is None or b.low <= x <= b.high:
                    continue
                metric = metrics[i]
                hits[metric] = num(x)
                hits[f"{metric}_peer_median"] = num(b.med)
                hits[f"{metric}_z"] = num(robust_z(x, b.med, b.scale, 0.0), 2)
            if not hits and key not in runs:
                continue
            out.extend(_sustain(self.book, runs, key, bool(hits), t,
                                int(p["sustain_samples"]), int(p["clear_samples"]),
                                kind=VerdictKind.HW_OUTLIER,
                                subject=gpu_subject(node, index), severity=None,
                                evidence=_evidence(hits, row.util, util_med, peers)))
        return out


def _evidence(hits: dict[str, Any], util: float, util_med: float,
              peers: int) -> Callable[[], dict[str, Any]]:
    return lambda: {**hits, "sm_util_pct": num(util), "peer_util_median": num(util_med),
                    "peers": peers,
                    "metrics": sorted(k for k in hits if not k.endswith(("_z", "_median")))}
