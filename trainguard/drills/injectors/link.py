"""Link faults in network namespaces the drill creates (``trainguard.netlab``): packet loss
through an nftables random drop, throttling through tc tbf, a link down or flapping through
ip link, and latency with jitter through Toxiproxy (this kernel has no netem)."""

from __future__ import annotations

import contextlib
from typing import Any

from trainguard.drills.injectors.base import Acted, InjectionError
from trainguard.netlab import LabError, NftDrop, Tbf, ToxiproxyServer, VethLab, flap_link, set_link


class NftLoss:
    """``loss_pct`` % of packets arriving in namespace ``b`` from ``a`` dropped."""

    def __init__(self, lab: VethLab, loss_pct: int) -> None:
        self.lab, self.pct = lab, loss_pct
        self.rule: NftDrop | None = None

    def inject(self) -> Acted:
        try:
            rule = NftDrop(self.lab.b, self.pct, saddr=self.lab.addr_a)
            rule.__enter__()
        except (LabError, ValueError) as exc:
            raise InjectionError(f"nftables drop: {exc}") from None
        self.rule = rule
        return Acted.now(mode="loss", loss_pct=self.pct, netns=self.lab.b.name,
                         table=rule.table)

    def counters(self) -> tuple[int, int]:
        return self.rule.counters() if self.rule else (0, 0)

    def undo(self) -> Acted:
        if self.rule is None:
            return Acted.now(undo="nothing to undo")
        seen, dropped = self.rule.counters()
        self.rule.__exit__(None, None, None)
        self.rule = None
        return Acted.now(mode="loss", packets_seen=seen, packets_dropped=dropped)


class TbfThrottle:
    def __init__(self, lab: VethLab, rate: str) -> None:
        self.lab, self.rate = lab, rate
        self.qdisc: Tbf | None = None

    def inject(self) -> Acted:
        try:
            q = Tbf(self.lab.a, self.lab.dev_a, self.rate)
            q.__enter__()
        except LabError as exc:
            raise InjectionError(f"tc tbf: {exc}") from None
        self.qdisc = q
        return Acted.now(mode="throttle", rate=self.rate, dev=self.lab.dev_a)

    def undo(self) -> Acted:
        if self.qdisc is None:
            return Acted.now(undo="nothing to undo")
        self.qdisc.__exit__(None, None, None)
        self.qdisc = None
        return Acted.now(mode="throttle", removed=True)


class LinkDown:
    """``flaps`` = 0: the link goes down until undone; > 0: it flaps that many times."""

    def __init__(self, lab: VethLab, flaps: int = 0, hold_ms: int = 200) -> None:
        self.lab, self.flaps, self.hold_ms = lab, flaps, hold_ms
        self.down = False

    def inject(self) -> Acted:
        try:
            if self.flaps:
                acted = Acted.now(mode="flap", flaps=self.flaps, hold_ms=self.hold_ms,
                                  dev=self.lab.dev_a)
                flap_link(self.lab.a, self.lab.dev_a, self.flaps, self.hold_ms / 1000)
                return acted
            set_link(self.lab.a, self.lab.dev_a, False)
        except LabError as exc:
            raise InjectionError(f"ip link: {exc}") from None
        self.down = True
        return Acted.now(mode="down", dev=self.lab.dev_a)

    def undo(self) -> Acted:
        if not self.down:
            return Acted.now(undo="the link is up")
        set_link(self.lab.a, self.lab.dev_a, True)
        self.down = False
        return Acted.now(mode="up", dev=self.lab.dev_a)


class ToxiLatency:
    """Latency ± jitter on a Toxiproxy proxy's streams (both directions)."""

    def __init__(self, server: ToxiproxyServer, proxy: str, latency_ms: int,
                 jitter_ms: int = 0) -> None:
        self.server, self.proxy = server, proxy
        self.latency_ms, self.jitter_ms = latency_ms, jitter_ms
        self.toxics: list[str] = []

    def inject(self) -> Acted:
        try:
            for stream in ("downstream", "upstream"):
                self.toxics.append(self.server.add_latency(
                    self.proxy, self.latency_ms, self.jitter_ms, stream=stream))
        except LabError as exc:
            self.undo()
            raise InjectionError(f"toxiproxy latency: {exc}") from None
        return Acted.now(mode="latency", latency_ms=self.latency_ms,
                         jitter_ms=self.jitter_ms, proxy=self.proxy)

    def undo(self) -> Acted:
        removed = 0
        for toxic in self.toxics:
            with contextlib.suppress(LabError):
                self.server.remove_toxic(self.proxy, toxic)
                removed += 1
        self.toxics = []
        return Acted.now(mode="latency", toxics_removed=removed)


def link_injector(lab: VethLab | None, params: dict[str, Any],
                  toxi: tuple[ToxiproxyServer, str] | None = None) -> (
        NftLoss | TbfThrottle | LinkDown | ToxiLatency):
    """The injector for a ``link`` fault's params."""
    mode = params.get("mode")
    if mode == "latency":
        if toxi is None:
            raise InjectionError("latency needs a Toxiproxy proxy on the path")
        return ToxiLatency(toxi[0], toxi[1], int(params["latency_ms"]),
                           int(params.get("jitter_ms", 0)))
    if lab is None:
        raise InjectionError(f"link {mode} needs the drill's network namespaces")
    if mode == "loss":
        return NftLoss(lab, int(params["loss_pct"]))
    if mode == "throttle":
        return TbfThrottle(lab, str(params["rate"]))
    if mode == "down":
        return LinkDown(lab)
    if mode == "flap":
        return LinkDown(lab, int(params["flaps"]), int(params.get("hold_ms", 200)))
    raise InjectionError(f"link mode: unknown {mode!r}")
