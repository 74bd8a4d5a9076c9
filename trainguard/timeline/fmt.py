"""Small formatting helpers shared by the renderers."""

from __future__ import annotations

from trainguard.events.clock import to_iso
from trainguard.timeline.model import Timeline


def clock(ts_us: int) -> str:
    """HH:MM:SS.mmm (UTC); the date is in the header."""
    return to_iso(ts_us)[11:23]


def rel(ts_us: int, zero_us: int) -> str:
    return f"{(ts_us - zero_us) / 1e6:+.3f}s"


def duration(tl: Timeline) -> str:
    if tl.closed_at is None:
        return "still open"
    return f"{(tl.closed_at - tl.opened_at) / 1e6:.3f} s"


def state_line(tl: Timeline) -> str:
    tier = f" (tier {tl.tier})" if tl.tier is not None else ""
    return f"{tl.state}{tier}"
