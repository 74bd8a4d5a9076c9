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
from typing import Any, cast

from trainguard.events.envelope import Event
from trainguard.events.payloads import NodeTelemetry, VerdictKind
from trainguard.rules.base import RuleBase, num
from trainguard.rules.gpu_health import _sustain, gpu_subject
from trainguard.rules.stats import mad, median, robust_z

_DIRECTION = {"temperature_c": 1, "sm_clock_mhz": -1, "power_w": 0,
              "memory_temperature_c": 1, "mem_clock_mhz": -1}


class HwOutlierRule(RuleBase):
    kinds = frozenset({VerdictKind.HW_OUTLIER})
    types = frozenset({"telemetry.node"})

    def initial_state(self) -> dict[str, Any]:
        # latest: "node/gpu" -> [time, util, metric values...]; runs: sustain counters;
        # stats: the job-wide statistics last computed and when (event time)
        return {"latest": {}, "runs": {}, "stats": None}

    def _job_stats(self, t: int, latest: dict[str, list[Any]], metrics: list[str]
                   ) -> tuple[float, list[tuple[float, float, float, float] | None], int] | None:
        """Median util and per-metric (median, scale, low, high) over the job's busy GPUs,
        recomputed at most every ``recompute_ms`` of event time (kept in the state, so a
        restored engine decides exactly as an uninterrupted one)."""
        p = self.p
        cached = self.s.get("stats")
        if cached is not None and t - cached["at"] < p["recompute_ms"] * 1000:
            if cached["util_med"] is None:
                return None
            return cached["util_med"], [None if b is None else
                                        (b[0], b[1], -math.inf if b[2] is None else b[2],
                                         math.inf if b[3] is None else b[3])
                                        for b in cached["bounds"]], cached["peers"]
        # stale samples leave only when the statistics are recomputed (nothing else reads
        # other GPUs' rows): one sweep per interval, not one per node record
        stale = int(p["stale_ms"] * 1000)
        for key in [k for k, v in latest.items() if t - v[0] > stale]:
            del latest[key]
        busy = [v for _, v in sorted(latest.items()) if v[1] >= p["min_util_pct"]]
        if len(busy) - 1 < int(p["min_peers"]):
            self.s["stats"] = {"at": t, "util_med": None, "bounds": [], "peers": 0}
            return None
        util_med = median([v[1] for v in busy])
        thr = p["z_threshold"]
        bounds: list[tuple[float, float, float, float] | None] = []
        for i, metric in enumerate(metrics):
            values = [v[2 + i] for v in busy if v[2 + i] is not None]
            if len(values) - 1 < int(p["min_peers"]):
                bounds.append(None)
                continue
            med = median(values)
            scale = max(mad(values, med), p["min_mad_fraction"] * abs(med), 1e-12)
            reach = thr * scale / 0.6745
            d = _DIRECTION.get(metric, 0)
            bounds.append((med, scale, med - reach if d <= 0 else -math.inf,
                           med + reach if d >= 0 else math.inf))
        self.s["stats"] = {"at": t, "util_med": util_med, "bounds": [
            None if b is None else [b[0], b[1], None if math.isinf(b[2]) else b[2],
                                    None if math.isinf(b[3]) else b[3]] for b in bounds],
                           "peers": len(busy) - 1}
        return util_med, bounds, len(busy) - 1

    def feed(self, event: Event) -> list[Event]:
        p = self.p
        node = event.subject.node or "-"
        t = event.event_time
        metrics: list[str] = p["metrics"]
        latest: dict[str, list[Any]] = self.s["latest"]
        mine: list[tuple[int, str]] = []
        for g in cast(NodeTelemetry, event.payload).gpus:
            if g.sm_util_pct is None:
                continue
            key = f"{node}/{g.index}"
            latest[key] = [t, g.sm_util_pct, *(getattr(g, m) for m in metrics)]
            mine.append((g.index, key))
        stats = self._job_stats(t, latest, metrics)
        if stats is None:
            return []
        util_med, bounds, peers = stats
        out: list[Event] = []
        runs = self.s["runs"]
        for index, key in mine:
            row = latest[key]
            if row[1] < p["min_util_pct"] or abs(row[1] - util_med) > p["util_band_pct"]:
                continue
            hits: dict[str, Any] = {}
            for i, b in enumerate(bounds):
                x = row[2 + i]
                if b is None or x is None or b[2] <= x <= b[3]:
                    continue
                metric = metrics[i]
                hits[metric] = num(x)
                hits[f"{metric}_peer_median"] = num(b[0])
                hits[f"{metric}_z"] = num(robust_z(x, b[0], b[1], 0.0), 2)
            if not hits and key not in runs:
                continue
            out.extend(_sustain(self.book, runs, key, bool(hits), t,
                                int(p["sustain_samples"]), int(p["clear_samples"]),
                                kind=VerdictKind.HW_OUTLIER,
                                subject=gpu_subject(node, index), severity=None,
                                evidence=_evidence(hits, row[1], util_med, peers)))
        return out


def _evidence(hits: dict[str, Any], util: float, util_med: float,
              peers: int) -> Callable[[], dict[str, Any]]:
    return lambda: {**hits, "sm_util_pct": num(util), "peer_util_median": num(util_med),
                    "peers": peers,
                    "metrics": sorted(k for k in hits if not k.endswith(("_z", "_median")))}
