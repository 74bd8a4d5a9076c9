"""--since / --until: an ISO-8601 time, epoch microseconds, or an offset from the log's start or
end: ``start+90s``, ``end-10m`` (bare ``+90s`` counts from the start, bare ``-10m`` from the
end)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainguard.compat import UTC, fromisoformat

_OFFSET = re.compile(r"^(start|end)?([+-])(\d+(?:\.\d+)?)(us|ms|s|m|h)$")
_UNIT_US = {"us": 1, "ms": 1_000, "s": 1_000_000, "m": 60_000_000, "h": 3_600_000_000}


class WindowError(ValueError):
    pass


def parse_when(text: str, *, field: str, first: int, last: int) -> int:
    """A point on the event-time axis (µs). ``first``/``last``: the log's first and last event
    times, which the offsets count from."""
    s = text.strip()
    m = _OFFSET.match(s)
    if m:
        anchor, sign, amount, unit = m.groups()
        delta = int(float(amount) * _UNIT_US[unit]) * (1 if sign == "+" else -1)
        if anchor is None:
            anchor = "start" if sign == "+" else "end"
        return (first if anchor == "start" else last) + delta
    if s.isdigit():
        return int(s)
    try:
        dt = fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise WindowError(
            f"{field}: not an ISO time, epoch microseconds or offset like start+30s / end-5m "
            f"(got {text!r})") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1_000_000)


@dataclass(frozen=True)
class Window:
    start: int | None = None
    end: int | None = None

    def __post_init__(self) -> None:
        if self.start is not None and self.end is not None and self.end < self.start:
            raise WindowError(f"--until: before --since ({self.end} < {self.start})")

    def contains(self, t: int) -> bool:
        return (self.start is None or t >= self.start) and (self.end is None or t <= self.end)

    @classmethod
    def parse(cls, start: str | None, end: str | None, *, first: int, last: int) -> Window:
        return cls(None if start is None else parse_when(start, field="--since", first=first,
                                                         last=last),
                   None if end is None else parse_when(end, field="--until", first=first,
                                                       last=last))
