"""Small pure statistics used by the rules: medians, median-without-one, robust z."""

from __future__ import annotations

from collections.abc import Sequence


def median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    if n == 0:
        raise ValueError("median of nothing")
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2.0


def median_without(sorted_xs: Sequence[float], i: int) -> float:
    """Median of ``sorted_xs`` with the element at index ``i`` left out, in O(1)."""
    n = len(sorted_xs) - 1
    if n <= 0:
        raise ValueError("median of nothing")

    def at(j: int) -> float:
        return sorted_xs[j] if j < i else sorted_xs[j + 1]

    mid = n // 2
    return at(mid) if n % 2 else (at(mid - 1) + at(mid)) / 2.0


def mad(xs: Sequence[float], med: float) -> float:
    return median([abs(x - med) for x in xs])


def robust_z(x: float, med: float, mad_value: float, floor: float) -> float:
    """0.6745 (x - median) / MAD, with the MAD floored so identical peers stay finite."""
    return 0.6745 * (x - med) / max(mad_value, floor, 1e-12)
