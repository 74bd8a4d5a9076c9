"""External fault feeds (``node.health`` ``EXTERNAL_FAULT_START`` / ``_END``, from a cluster's
fault log: ``trainguard import faults``, ``FaultLogFollower``) -> one ``external_fault`` verdict
per (node, fault class) that opens at the first start and resolves at the matching end.

Faults of one (node, class) that overlap are nested: the verdict stays open until as many ends
as starts were seen, so every verdict resolves exactly once and its incident pairs with it. An
end with no open start (the log began mid-fault) is ignored. The verdict is a notice
(``severity`` warning by default); the policy takes no action on it (docs/rules.md).
"""

from __future__ import annotations

from typing import Any

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import NodeHealth, NodeHealthKind, VerdictKind
from trainguard.rules.base import Context, RuleBase

MESSAGE_EVIDENCE = 240


class ExternalFaultRule(RuleBase):
    kinds = frozenset({VerdictKind.EXTERNAL_FAULT})
    types = frozenset({"node.health"})
    prompt_types = frozenset({"node.health"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.depth: dict[str, int] = {}  # "node|class" -> faults of that key open now

    def state_doc(self) -> dict[str, Any]:
        return {"depth": self.depth}

    def load_state(self, doc: dict[str, Any]) -> None:
        self.depth = {str(k): int(n) for k, n in doc.get("depth", {}).items()}

    def prompt(self, event: Event) -> list[Event]:
        """A fault's start opens on arrival (a feed's node may send nothing else for hours,
        so its watermark would hold the start back); its end waits for the ordered lane."""
        h = event.payload
        if type(h) is not NodeHealth or h.kind is not NodeHealthKind.EXTERNAL_FAULT_START:
            return []
        key, opened = self._open_args(event, h)
        return self.book.preview(key, **opened)

    def _open_args(self, event: Event, h: NodeHealth) -> tuple[str, dict[str, Any]]:
        node = event.subject.node
        cls = h.fault_class or "unknown"
        t = event.event_time
        return f"{node}|{cls}", {
            "kind": VerdictKind.EXTERNAL_FAULT, "subject": Subject(node=node), "severity": None,
            "first_time": t, "decided_time": t,
            "evidence": {"fault_class": cls, "code": h.code, "origin": h.origin,
                         "message": h.message[:MESSAGE_EVIDENCE]}}

    def feed(self, event: Event) -> list[Event]:
        h = event.payload
        if type(h) is not NodeHealth or h.kind not in (NodeHealthKind.EXTERNAL_FAULT_START,
                                                       NodeHealthKind.EXTERNAL_FAULT_END):
            return []
        node = event.subject.node
        cls = h.fault_class or "unknown"
        key = f"{node}|{cls}"
        depth = self.depth
        t = event.event_time
        if h.kind is NodeHealthKind.EXTERNAL_FAULT_START:
            depth[key] = depth.get(key, 0) + 1
            _, opened = self._open_args(event, h)
            return self.book.raise_(key, **opened)
        n = depth.get(key, 0)
        if n == 0:
            return []
        if n > 1:
            depth[key] = n - 1
            return []
        del depth[key]
        return self.book.resolve(key, decided_time=t, evidence={"fault_class": cls,
                                                                "code": h.code})
