"""Link faults inside a lab namespace: nftables random drops, tc tbf throttling, link flaps.

Each fault is a context manager that removes itself on exit; deleting the namespace removes
them too, so a crashed test leaves nothing behind either.
"""

from __future__ import annotations

import json
import time
import uuid
from types import TracebackType
from typing import Any

from trainguard.netlab.ns import LabError, Netns, require


class NftDrop:
    """Drop ``percent`` % of matching packets at random (``numgen random mod 100 < N``) in the
    ``hook`` (output/input) of ``ns``, only toward/from ``daddr``/``saddr`` and, if given,
    ``tcp dport``. Two counters: packets matched (``seen``) and dropped (``dropped``).

    Wire loss is the receiver's ``input`` hook (the default): a drop in the sender's own
    ``output`` hook is reported to its TCP at once (the send fails with EPERM) and TCP just sends
    again later, so it is not seen as loss and barely retransmits."""

    def __init__(self, ns: Netns, percent: int, *, daddr: str | None = None,
                 saddr: str | None = None, dport: int | None = None,
                 hook: str = "input", established_only: bool = True) -> None:
        if not 0 <= percent <= 100:
            raise ValueError("percent must be 0..100")
        require("nft")
        self.ns, self.percent, self.hook = ns, percent, hook
        self.table = f"tglab_{uuid.uuid4().hex[:8]}"
        match: list[str] = []
        if daddr:
            match += ["ip", "daddr", daddr]
        if saddr:
            match += ["ip", "saddr", saddr]
        if dport is not None:
            match += ["tcp", "dport", str(dport)]
        if established_only:  # keep the handshake: a lost SYN costs a 1 s retry
            match += ["ct", "state", "established"]
        self.match = " ".join(match)

    def __enter__(self) -> NftDrop:
        t = self.table
        script = (
            f"table inet {t} {{\n"
            f"  counter seen {{ }}\n  counter dropped {{ }}\n"
            f"  chain c {{ type filter hook {self.hook} priority 0; policy accept;\n"
            f"    {self.match} counter name seen\n"
            f"    {self.match} numgen random mod 100 < {self.percent} counter name dropped drop\n"
            f"  }}\n}}\n")
        self.ns.run("nft", "-f", "-", input_text=script)
        return self

    def counters(self) -> tuple[int, int]:
        """(packets seen, packets dropped) so far."""
        out = self.ns.run("nft", "-j", "list", "counters", "table", "inet", self.table).stdout
        vals: dict[str, int] = {}
        for item in json.loads(out).get("nftables", []):
            c: dict[str, Any] | None = item.get("counter")
            if c:
                vals[str(c["name"])] = int(c["packets"])
        return vals.get("seen", 0), vals.get("dropped", 0)

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.ns.run("nft", "delete", "table", "inet", self.table, check=False)


class Tbf:
    """A tbf root qdisc on ``dev`` in ``ns``: ``rate`` (tc syntax, e.g. ``8mbit``)."""

    def __init__(self, ns: Netns, dev: str, rate: str, *, burst: str = "16kb",
                 latency: str = "100ms") -> None:
        require("tc")
        self.ns, self.dev = ns, dev
        self.args = ["rate", rate, "burst", burst, "latency", latency]

    def __enter__(self) -> Tbf:
        self.ns.run("tc", "qdisc", "replace", "dev", self.dev, "root", "tbf", *self.args)
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.ns.run("tc", "qdisc", "del", "dev", self.dev, "root", check=False)


def set_link(ns: Netns, dev: str, up: bool) -> None:
    ns.ip("link", "set", dev, "up" if up else "down")


def wait_operstate(ns: Netns, dev: str, want: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    got = ""
    while time.monotonic() < deadline:
        got = ns.run("cat", f"/sys/class/net/{dev}/operstate").stdout.strip()
        if got == want:
            return
        time.sleep(0.02)
    raise LabError(f"{dev} operstate stayed {got!r}, wanted {want!r}")


def flap_link(ns: Netns, dev: str, times: int, hold_s: float = 0.05) -> None:
    """Take ``dev`` down and up ``times`` times, ``hold_s`` in each state; ends up."""
    for _ in range(times):
        set_link(ns, dev, False)
        time.sleep(hold_s)
        set_link(ns, dev, True)
        time.sleep(hold_s)
