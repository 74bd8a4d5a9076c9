"""Per-GPU health from telemetry samples: throttling and ECC.

``ThrottleRule``: thermal (a thermal clock-event reason, or temperature above
``max_temperature_c``) and power-brake throttling, each opened after ``sustain_samples``
consecutive samples and resolved after ``clear_samples`` clean ones. ``sw_power_cap`` is left
out by default: a GPU at full load sits at its power cap by design.

``EccRule``: volatile DBE above ``dbe_max`` and a row-remap failure are critical (the rule's
severity); a pending row remap and a volatile SBE growth above ``sbe_rate_per_hour`` (over at
least ``sbe_min_span_ms``) are warnings. Each resolves when its reading clears (a GPU reset
zeroes the volatile counters and performs pending remaps).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import GpuSample, NodeTelemetry, Severity, VerdictKind
from trainguard.rules.base import Context, RuleBase, VerdictBook, num


@dataclass(slots=True)
class Run:
    """A sustain counter: the current run of bad and of good samples, and when the bad run
    began (JSON: ``[bad, good, first]``)."""

    bad: int
    good: int
    first: int

    def doc(self) -> list[int]:
        return [self.bad, self.good, self.first]

    @classmethod
    def from_doc(cls, doc: list[Any]) -> Run:
        return cls(int(doc[0]), int(doc[1]), int(doc[2]))


def runs_doc(runs: dict[str, Run]) -> dict[str, list[int]]:
    return {k: r.doc() for k, r in runs.items()}


def runs_from_doc(doc: dict[str, Any]) -> dict[str, Run]:
    return {str(k): Run.from_doc(r) for k, r in doc.items()}


@dataclass(slots=True)
class Anchor:
    """A GPU's SBE count at a time, what its rate is measured from (JSON: ``[time, count]``)."""

    time: int
    count: int

    def doc(self) -> list[int]:
        return [self.time, self.count]


def _gpu_key(node: str, gpu: int) -> str:
    return f"{node}/{gpu}"


def _sustain(book: VerdictBook, counters: dict[str, Run], key: str, bad: bool, t: int,
             sustain: int, clear: int, *, kind: VerdictKind, subject: Callable[[], Subject],
             severity: Severity | None, evidence: Callable[[], dict[str, Any]]) -> list[Event]:
    """Open after ``sustain`` bad samples in a row, resolve after ``clear`` good ones.
    Subject and evidence are built only when a verdict is made (this runs for every GPU of
    every sample)."""
    c = counters.get(key)
    if c is None:
        if not bad:
            return []  # never bad: nothing to remember
        c = counters[key] = Run(0, 0, t)
    if bad:
        if c.bad == 0:
            c.first = t
        c.bad += 1
        c.good = 0
        if c.bad >= sustain and not book.is_open(key):
            return book.raise_(key, kind=kind, subject=subject(), severity=severity,
                               first_time=c.first, decided_time=t, evidence=evidence())
    else:
        c.bad = 0
        c.good += 1
        if c.good >= clear:
            del counters[key]
            if book.is_open(key):
                return book.resolve(key, decided_time=t, evidence=evidence())
    return []


class ThrottleRule(RuleBase):
    kinds = frozenset({VerdictKind.THERMAL_THROTTLE, VerdictKind.POWER_THROTTLE})
    types = frozenset({"telemetry.node"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.runs: dict[str, Run] = {}  # "thermal:node/gpu" or "power:node/gpu" -> its run

    def state_doc(self) -> dict[str, Any]:
        return {"runs": runs_doc(self.runs)}

    def load_state(self, doc: dict[str, Any]) -> None:
        self.runs = runs_from_doc(doc.get("runs", {}))

    def feed(self, event: Event) -> list[Event]:
        node = event.subject.node or "-"
        t = event.event_time
        p = self.p
        thermal_names = set(p["thermal_reasons"])
        power_names = set(p["power_reasons"])
        out: list[Event] = []
        sustain, clear = int(p["sustain_samples"]), int(p["clear_samples"])
        runs = self.runs
        for g in cast(NodeTelemetry, event.payload).gpus:
            reasons = g.throttle_reasons
            hot = g.temperature_c is not None and g.temperature_c > p["max_temperature_c"]
            thermal = hot or any(r in thermal_names for r in reasons)
            power = any(r in power_names for r in reasons)
            if not (thermal or power or runs):
                continue
            key = _gpu_key(node, g.index)
            if thermal or f"thermal:{key}" in runs:
                out.extend(_sustain(self.book, runs, f"thermal:{key}", thermal, t, sustain,
                                    clear, kind=VerdictKind.THERMAL_THROTTLE,
                                    subject=_subject(node, g),
                                    severity=None, evidence=_throttle_evidence(g)))
            if power or f"power:{key}" in runs:
                out.extend(_sustain(self.book, runs, f"power:{key}", power, t, sustain, clear,
                                    kind=VerdictKind.POWER_THROTTLE, subject=_subject(node, g),
                                    severity=None, evidence=_throttle_evidence(g)))
        return out


def _subject(node: str, g: GpuSample) -> Callable[[], Subject]:
    return gpu_subject(node, g.index)


def gpu_subject(node: str, index: int) -> Callable[[], Subject]:
    return lambda: Subject(node=node, gpu=index)


def _throttle_evidence(g: GpuSample) -> Callable[[], dict[str, Any]]:
    return lambda: {
        "temperature_c": None if g.temperature_c is None else num(g.temperature_c),
        "power_w": None if g.power_w is None else num(g.power_w),
        "sm_clock_mhz": None if g.sm_clock_mhz is None else num(g.sm_clock_mhz),
        "reasons": list(g.throttle_reasons)}


class EccRule(RuleBase):
    kinds = frozenset({VerdictKind.ECC_DBE, VerdictKind.ECC_SBE_RATE,
                       VerdictKind.ROW_REMAP_FAILURE, VerdictKind.ROW_REMAP_PENDING})
    types = frozenset({"telemetry.node"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.sbe: dict[str, Anchor] = {}  # "node/gpu" -> its SBE rate's anchor

    def state_doc(self) -> dict[str, Any]:
        return {"sbe": {k: a.doc() for k, a in self.sbe.items()}}

    def load_state(self, doc: dict[str, Any]) -> None:
        self.sbe = {str(k): Anchor(int(a[0]), int(a[1])) for k, a in doc.get("sbe", {}).items()}

    def feed(self, event: Event) -> list[Event]:
        node = event.subject.node or "-"
        out: list[Event] = []
        for g in cast(NodeTelemetry, event.payload).gpus:
            out.extend(self._gpu(node, g, event.event_time))
        return out

    def _flag(self, key: str, bad: bool | None, kind: VerdictKind, subject: Callable[[], Subject],
              sev: Severity | None, t: int, evidence: dict[str, Any]) -> list[Event]:
        if bad is None:
            return []
        if bad:
            if self.book.is_open(key):
                return []
            return self.book.raise_(key, kind=kind, subject=subject(), severity=sev,
                                    first_time=t, decided_time=t, evidence=evidence)
        return self.book.resolve(key, decided_time=t, evidence=evidence) if (
            self.book.open and self.book.is_open(key)) else []

    def _gpu(self, node: str, g: GpuSample, t: int) -> list[Event]:
        if g.ecc_sbe_volatile is None and not self.book.open and not (
                g.ecc_dbe_volatile or g.remapped_rows_failure or g.remapped_rows_pending):
            return []  # the common case: nothing to see, nothing open
        key = _gpu_key(node, g.index)
        if not self.book.open and not g.ecc_dbe_volatile and not g.remapped_rows_failure and (
                not g.remapped_rows_pending) and (g.ecc_sbe_volatile is None
                                                  or key in self.sbe):
            if g.ecc_sbe_volatile is None:
                return []
            return self._sbe(key, gpu_subject(node, g.index), g.ecc_sbe_volatile, t, {})
        subject = gpu_subject(node, g.index)
        ev: dict[str, Any] = {"dbe_volatile": g.ecc_dbe_volatile,
                              "sbe_volatile": g.ecc_sbe_volatile,
                              "remapped_rows_failure": g.remapped_rows_failure,
                              "remapped_rows_pending": g.remapped_rows_pending}
        dbe = None if g.ecc_dbe_volatile is None else g.ecc_dbe_volatile > self.p["dbe_max"]
        out = self._flag(f"dbe:{key}", dbe, VerdictKind.ECC_DBE, subject, None, t, ev)
        out += self._flag(f"remap_fail:{key}", g.remapped_rows_failure,
                          VerdictKind.ROW_REMAP_FAILURE, subject, None, t, ev)
        out += self._flag(f"remap_pending:{key}", g.remapped_rows_pending,
                          VerdictKind.ROW_REMAP_PENDING, subject, Severity.WARNING, t, ev)
        if g.ecc_sbe_volatile is not None:
            out += self._sbe(key, subject, g.ecc_sbe_volatile, t, ev)
        return out

    def _sbe(self, key: str, subject: Callable[[], Subject], count: int, t: int,
             ev: dict[str, Any]) -> list[Event]:
        anchor = self.sbe.get(key)
        if anchor is None or count < anchor.count:
            self.sbe[key] = Anchor(t, count)
            return []
        span = t - anchor.time
        if span < self.p["sbe_min_span_ms"] * 1000:
            return []
        rate = (count - anchor.count) / (span / 3.6e9)
        self.sbe[key] = Anchor(t, count)
        return self._flag(f"sbe:{key}", rate > self.p["sbe_rate_per_hour"],
                          VerdictKind.ECC_SBE_RATE, subject, Severity.WARNING, t,
                          {**ev, "sbe_per_hour": num(rate)})
