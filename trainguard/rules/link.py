"""NIC / InfiniBand links: down, and flapping.

Signals: node.health LINK_DOWN / LINK_UP (``device`` names the link), and NicSample operstate,
carrier and carrier_changes in telemetry. A link seen up that goes down opens a critical
``link_down`` at node+link (a NIC never seen up is an unused port, not a fault); it resolves
when the link is up again. ``flap_count`` transitions within ``flap_window_ms`` open a warning
``link_flapping`` that resolves once a whole window passes without a transition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass(slots=True)
class Link:
    """One NIC / link of a node (JSON: ``{"up", "changes", "tr"}``)."""

    up: bool | None = None  # None: never seen
    changes: int | None = None  # its last carrier_changes counter
    tr: list[int] = field(default_factory=list)  # the times of its recent transitions

    def doc(self) -> dict[str, Any]:
        return {"up": self.up, "changes": self.changes, "tr": self.tr}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Link:
        up, changes = doc.get("up"), doc.get("changes")
        return cls(None if up is None else bool(up), None if changes is None else int(changes),
                   [int(x) for x in doc.get("tr", [])])


class LinkRule(RuleBase):
    kinds = frozenset({VerdictKind.LINK_DOWN, VerdictKind.LINK_FLAPPING})
    types = frozenset({"node.health", "telemetry.node"})
    prompt_types = frozenset({"node.health"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.links: dict[str, Link] = {}  # "node|link" -> its state

    def state_doc(self) -> dict[str, Any]:
        return {"links": {k: lk.doc() for k, lk in self.links.items()}}

    def load_state(self, doc: dict[str, Any]) -> None:
        self.links = {str(k): Link.from_doc(lk) for k, lk in doc.get("links", {}).items()}

    def feed(self, event: Event) -> list[Event]:
        node = event.subject.node or "-"
        t = event.event_time
        payload = event.payload
        out: list[Event] = []
        if type(payload) is NodeHealth:
            h = payload
            if h.kind in (NodeHealthKind.LINK_DOWN, NodeHealthKind.LINK_UP):
                link = h.device or event.subject.link or "-"
                out.extend(self._state(node, link, h.kind is NodeHealthKind.LINK_UP, t,
                                       transition=True, origin=h.origin))
        elif type(payload) is NodeTelemetry:
            for nic in payload.nics:
                up: bool | None = nic.carrier
                if nic.operstate is not None:
                    up = nic.operstate.lower() == "up" if up is None else (
                        up and nic.operstate.lower() == "up")
                lk = self._link(node, nic.name)
                extra = 0
                if nic.carrier_changes is not None:
                    prev = lk.changes
                    if prev is not None and nic.carrier_changes > prev:
                        extra = nic.carrier_changes - prev
                    lk.changes = nic.carrier_changes
                lk.tr.extend([t] * min(extra, int(self.p["flap_count"])))
                out.extend(self._state(node, nic.name, up, t, transition=False,
                                       origin="telemetry"))
        return out

    def prompt(self, event: Event) -> list[Event]:
        """A LINK_DOWN from the kernel log opens at once, as ``_state`` will when it gets it."""
        h = event.payload
        if type(h) is not NodeHealth or h.kind is not NodeHealthKind.LINK_DOWN:
            return []
        node = event.subject.node or "-"
        link = h.device or event.subject.link or "-"
        lk = self.links.get(f"{node}|{link}")
        if lk is not None and lk.up is False:
            return []  # already down: the transition was decided before
        return self.book.preview(f"down:{node}|{link}", kind=VerdictKind.LINK_DOWN,
                                 subject=Subject(node=node, link=link), severity=None,
                                 first_time=event.event_time, decided_time=event.event_time,
                                 evidence={"origin": h.origin})

    def _link(self, node: str, link: str) -> Link:
        key = f"{node}|{link}"
        lk = self.links.get(key)
        if lk is None:
            lk = self.links[key] = Link()
        return lk

    def _state(self, node: str, link: str, up: bool | None, t: int, *, transition: bool,
               origin: str) -> list[Event]:
        lk = self._link(node, link)
        key = f"{node}|{link}"
        out: list[Event] = []
        if up is not None and up != lk.up:
            if lk.up is not None or transition:
                lk.tr.append(t)
            if not up and (lk.up is True or transition):
                out.extend(self.book.raise_(f"down:{key}", kind=VerdictKind.LINK_DOWN,
                                            subject=Subject(node=node, link=link),
                                            severity=None, first_time=t, decided_time=t,
                                            evidence={"origin": origin}))
            elif up:
                out.extend(self.book.resolve(f"down:{key}", decided_time=t,
                                             evidence={"origin": origin}))
            lk.up = up
        window = int(self.p["flap_window_ms"] * 1000)
        lk.tr = [x for x in lk.tr if t - x <= window]
        count = len(lk.tr)
        if count >= int(self.p["flap_count"]) and not self.book.is_open(f"flap:{key}"):
            out.extend(self.book.raise_(f"flap:{key}", kind=VerdictKind.LINK_FLAPPING,
                                        subject=Subject(node=node, link=link),
                                        severity=Severity.WARNING, first_time=lk.tr[0],
                                        decided_time=t,
                                        evidence={"transitions": count,
                                                  "window_ms": self.p["flap_window_ms"]}))
        elif count == 0:
            out.extend(self.book.resolve(f"flap:{key}", decided_time=t,
                                         evidence={"transitions": 0}))
        return out
