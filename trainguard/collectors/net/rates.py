"""Counter deltas and rates between two reads: never negative.

A counter that went down either wrapped (a 32-bit driver counter passing 2**32) or was reset
(driver reload, interface re-created). A wrap is taken when the old value fits 32 bits and the
wrapped delta is below 2**31; anything else is a reset, whose delta is unknown (``None``).
"""

from __future__ import annotations

WRAP32 = 2**32


def counter_delta(old: int | None, new: int | None) -> int | None:
    if old is None or new is None or old < 0 or new < 0:
        return None
    if new >= old:
        return new - old
    if old < WRAP32:
        wrapped = WRAP32 - old + new
        if wrapped < 2**31:
            return wrapped
    return None


def rate(old: int | None, new: int | None, dt_s: float) -> float | None:
    """Per-second rate of a counter over ``dt_s``; ``None`` if unknown (first read, reset,
    no time passed)."""
    if dt_s <= 0:
        return None
    delta = counter_delta(old, new)
    return None if delta is None else delta / dt_s
