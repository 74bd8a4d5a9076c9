"""GPU XID errors, from kernel log lines (node.health XID) and from telemetry samples.

Classes (NVIDIA's XID catalogue): the must-drain class (48 DBE, 64 remap failure, 74 NVLink,
79 fallen off the bus, 92 high SBE rate, 95 uncontained ECC, 119/120 GSP, 140 unrecovered ECC)
opens a critical verdict at the GPU (node when the GPU is unknown) that only an operator clears;
application XIDs (13 graphics exception, 31 MMU fault, 43 reset channel, 45 preemptive
cleanup) are the program's fault: a warning at the job. Others: a warning at the GPU. Non-drain
verdicts resolve after ``resolve_quiet_ms`` without a repeat.
"""

from __future__ import annotations

from typing import Any

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import (
    NodeHealth,
    NodeHealthKind,
    NodeTelemetry,
    Severity,
    VerdictKind,
)
from trainguard.rules.base import Context, RuleBase

XID_KINDS = {"drain": VerdictKind.XID_DRAIN, "app": VerdictKind.XID_APP,
             "other": VerdictKind.XID_OTHER}


def xid_class(code: int, drain: list[int], app: list[int]) -> str:
    if code in drain:
        return "drain"
    if code in app:
        return "app"
    return "other"


class XidRule(RuleBase):
    kinds = frozenset({VerdictKind.XID_DRAIN, VerdictKind.XID_APP, VerdictKind.XID_OTHER})
    types = frozenset({"node.health", "telemetry.node"})
    prompt_types = frozenset({"node.health"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.last: dict[str, int] = {}  # key of a non-drain open verdict -> last time seen

    def state_doc(self) -> dict[str, Any]:
        return {"last": self.last}

    def load_state(self, doc: dict[str, Any]) -> None:
        self.last = {str(k): int(t) for k, t in doc.get("last", {}).items()}

    def feed(self, event: Event) -> list[Event]:
        t = event.event_time
        node = event.subject.node
        out: list[Event] = self._quiet(t)
        payload = event.payload
        if type(payload) is NodeHealth:
            h = payload
            if h.kind is NodeHealthKind.XID and h.code is not None:
                out.extend(self._xid(h.code, node, event.subject.gpu, t, h.origin))
        elif type(payload) is NodeTelemetry:
            for g in payload.gpus:
                for code in g.xids:
                    out.extend(self._xid(code, node, g.index, t, "telemetry"))
        return out

    def prompt(self, event: Event) -> list[Event]:
        """A must-drain XID from the kernel log opens at once (it needs no peers)."""
        h = event.payload
        if type(h) is not NodeHealth or h.kind is not NodeHealthKind.XID or h.code is None:
            return []
        if xid_class(h.code, self.p["drain_codes"], self.p["app_codes"]) != "drain":
            return []
        node, gpu = event.subject.node, event.subject.gpu
        return self.book.preview(f"drain:{node}:{gpu}", kind=VerdictKind.XID_DRAIN,
                                 subject=Subject(node=node, gpu=gpu),
                                 severity=self.ctx.rule.severity, first_time=event.event_time,
                                 decided_time=event.event_time,
                                 evidence=_evidence(h.code, "drain", h.origin))

    def _xid(self, code: int, node: str | None, gpu: int | None, t: int,
             origin: str) -> list[Event]:
        cls = xid_class(code, self.p["drain_codes"], self.p["app_codes"])
        evidence = _evidence(code, cls, origin)
        if cls == "app":
            key, subject, sev = f"app:{code}", Subject(), Severity(self.p["app_severity"])
            evidence["node"] = node
            evidence["gpu"] = gpu
        else:
            key = f"{cls}:{node}:{gpu}" + ("" if cls == "drain" else f":{code}")
            subject = Subject(node=node, gpu=gpu)
            sev = self.ctx.rule.severity if cls == "drain" else Severity(
                self.p["other_severity"])
        if cls != "drain":
            self.last[key] = t
        return self.book.raise_(key, kind=XID_KINDS[cls], subject=subject, severity=sev,
                                first_time=t, decided_time=t, evidence=evidence)

    def _quiet(self, t: int) -> list[Event]:
        last = self.last
        if not last:
            return []
        quiet = int(self.p["resolve_quiet_ms"] * 1000)
        out: list[Event] = []
        for key in sorted(last):
            if t - last[key] > quiet:
                del last[key]
                out.extend(self.book.resolve(key, decided_time=t,
                                             evidence={"quiet_ms": self.p["resolve_quiet_ms"]}))
        return out


def _evidence(code: int, cls: str, origin: str) -> dict[str, Any]:
    return {"xid": code, "xid_class": cls, "origin": origin}
