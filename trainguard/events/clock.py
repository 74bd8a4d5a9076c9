"""Time on the event axis: integer microseconds since the Unix epoch (UTC).

Integers keep encodings byte-identical across replays and stay below 2**53, so JSON readers in
any language hold them exactly. The wall clock is read only at the edges (collectors, producers);
rules and replay use the times carried in events.
"""

from __future__ import annotations

import time
from datetime import datetime

from trainguard.compat import UTC

US_PER_S = 1_000_000
US_PER_MS = 1_000


def now_us() -> int:
    return time.time_ns() // 1_000


def to_datetime(ts_us: int) -> datetime:
    return datetime.fromtimestamp(ts_us / US_PER_S, tz=UTC)


def to_iso(ts_us: int) -> str:
    """ISO-8601 with microseconds, always UTC ('Z')."""
    return to_datetime(ts_us).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
