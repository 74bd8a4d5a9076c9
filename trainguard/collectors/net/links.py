"""Link state between two collects -> LINK_DOWN / LINK_UP health events. Pure.

Two signals, both per interface:
- ``operstate`` (or an IB port's state) changing between up and not-up: one event, the new
  state's kind;
- ``carrier_changes`` (or an IB port's ``link_downed``) rising while the state looks the same:
  the link flapped between collects. That gives a LINK_DOWN and, if the link is up again now,
  a LINK_UP, each with ``code`` = the number of carrier changes in the interval, so a flap that
  came and went within one interval is never lost.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.events.payloads import NodeHealth, NodeHealthKind

# Link changes are read from /sys/class/net (and IB port state), not from the kernel log.
LINK_ORIGIN = "sysfs"


@dataclass(frozen=True)
class LinkState:
    operstate: str | None
    carrier: bool | None
    changes: int | None  # carrier_changes, or link_downed for an IB port


def is_up(state: LinkState) -> bool | None:
    """Carrier first: it drops at once, while the kernel's linkwatch may take up to a second to
    move operstate. An ``unknown`` operstate (many virtual devices) leaves it to the carrier."""
    if state.carrier is False:
        return False
    if state.operstate is None or state.operstate == "unknown":
        return state.carrier
    return state.operstate == "up"


def link_events(device: str, old: LinkState | None, new: LinkState,
                *, counter: str = "carrier_changes") -> list[NodeHealth]:
    if old is None:
        return []
    was, now = is_up(old), is_up(new)
    delta = None
    if old.changes is not None and new.changes is not None and new.changes > old.changes:
        delta = new.changes - old.changes
    where = (f"{device}: operstate {old.operstate}->{new.operstate}, "
             f"carrier {_c(old.carrier)}->{_c(new.carrier)}, "
             f"{counter} {old.changes}->{new.changes} (sysfs)")
    if was is not None and now is not None and was != now:
        kind = NodeHealthKind.LINK_UP if now else NodeHealthKind.LINK_DOWN
        return [_ev(kind, device, delta, where)]
    if delta:
        events = [_ev(NodeHealthKind.LINK_DOWN, device, delta, "flapped: " + where)]
        if now is not False:
            events.append(_ev(NodeHealthKind.LINK_UP, device, delta, "flapped: " + where))
        return events
    return []


def _ev(kind: NodeHealthKind, device: str, code: int | None, message: str) -> NodeHealth:
    return NodeHealth(kind=kind, device=device, code=code, message=message[:4096],
                      origin=LINK_ORIGIN)


def _c(carrier: bool | None) -> str:
    return "?" if carrier is None else str(int(carrier))
