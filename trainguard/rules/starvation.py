"""Data starvation: most ranks spend a large share of their step waiting for input.

Per rank, the share ``data_wait_ms / step time`` (``step_ms``, else compute + comm + data wait)
is averaged over ``window_steps`` reports. When at least ``min_rank_fraction`` of the ranks are
at or above ``wait_share`` - and, if telemetry gives the job's GPU SM utilisation, its median is
below ``max_gpu_util_pct`` - one verdict is opened at the job's data source (subject unit
``data-source``): the input pipeline, not any one rank, is the fault. It resolves when the
ranks' median share falls below ``resolve_share``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import NodeTelemetry, StepReport, VerdictKind
from trainguard.rules import steps
from trainguard.rules.base import Context, RuleBase, num
from trainguard.rules.stats import median


@dataclass(slots=True)
class StarvationState:
    """JSON via ``doc``/``from_doc``, one key per field; keys missing (an older layout) take
    their initial values."""

    hist: dict[str, list[float]] = field(default_factory=dict)  # rank -> its last wait shares
    share: dict[str, float] = field(default_factory=dict)  # rank -> its window mean
    starving: int = 0  # ranks whose mean is at or above wait_share
    util: dict[str, list[float]] = field(default_factory=dict)  # node -> its GPUs' SM util

    def doc(self) -> dict[str, Any]:
        return {"hist": self.hist, "share": self.share, "starving": self.starving,
                "util": self.util}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> StarvationState:
        return cls(hist={str(r): [float(x) for x in h] for r, h in doc.get("hist", {}).items()},
                   share={str(r): float(m) for r, m in doc.get("share", {}).items()},
                   starving=int(doc.get("starving", 0)),
                   util={str(n): list(u) for n, u in doc.get("util", {}).items()})


def wait_share(rep: StepReport) -> float | None:
    if rep.data_wait_ms is None:
        return None
    total = rep.step_ms if rep.step_ms else rep.compute_ms + (rep.comm_ms or 0.0) + rep.data_wait_ms
    return min(rep.data_wait_ms / total, 1.0) if total > 0 else None


class DataStarvationRule(RuleBase):
    kinds = frozenset({VerdictKind.DATA_STARVATION})
    types = frozenset({"step.report", "telemetry.node"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.st = StarvationState()

    def state_doc(self) -> dict[str, Any]:
        return self.st.doc()

    def load_state(self, doc: dict[str, Any]) -> None:
        self.st = StarvationState.from_doc(doc)

    def rebind(self, rank: str, event: Event) -> list[Event]:
        """A new replica's window starts afresh (its loader warms up on its own)."""
        s = self.st
        s.hist.pop(rank, None)
        before = s.share.pop(rank, None)
        if before is not None and before >= self.p["wait_share"]:
            s.starving -= 1
        return []

    def feed(self, event: Event) -> list[Event]:
        p, s = self.p, self.st
        payload = event.payload
        if type(payload) is NodeTelemetry:
            utils = [g.sm_util_pct for g in payload.gpus if g.sm_util_pct is not None]
            s.util[event.subject.node or "-"] = utils
            return []
        rep = cast(StepReport, payload)
        share = wait_share(rep)
        if share is None:
            return []
        rank = str(rep.rank)
        mean = steps.push_window(s.hist, rank, share, int(p["window_steps"]))
        if mean is None:
            return []
        before = s.share.get(rank)
        if before is not None and before >= p["wait_share"]:
            s.starving -= 1
        if mean >= p["wait_share"]:
            s.starving += 1
        s.share[rank] = mean
        ranks = len(s.share)
        fraction = s.starving / ranks
        t = event.event_time
        if not self.book.open:
            if fraction < p["min_rank_fraction"]:
                return []
            every = [u for node in sorted(s.util) for u in s.util[node]]
            util = median(every) if every else None
            if util is not None and util >= p["max_gpu_util_pct"]:
                return []
            return self.book.raise_(
                "data", kind=VerdictKind.DATA_STARVATION, subject=Subject(unit="data-source"),
                severity=None, first_time=t, decided_time=t,
                evidence={"starving_ranks": s.starving, "ranks": ranks,
                          "median_wait_share": num(median(list(s.share.values()))),
                          "gpu_util_median": None if util is None else num(util),
                          "window_steps": int(p["window_steps"])})
        med = median(list(s.share.values()))
        if med < p["resolve_share"]:
            return self.book.resolve("data", decided_time=t,
                                     evidence={"median_wait_share": num(med), "ranks": ranks})
        return []
