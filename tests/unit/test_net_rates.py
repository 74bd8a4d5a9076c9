"""Counter deltas and rates: wraps, resets, never negative."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.collectors.net.rates import WRAP32, counter_delta, rate


@pytest.mark.parametrize(("old", "new", "want"), [
    (100, 150, 50),
    (100, 100, 0),
    (WRAP32 - 100, 50, 150),             # a 32-bit counter wrapped
    (2**40, 5, None),                    # a 64-bit counter went down: reset, unknown
    (1_000_000_000, 10, None),           # a "wrap" >= 2**31 is taken as a reset
    (3_000_000_000, 10, WRAP32 - 3_000_000_000 + 10),  # < 2**31: a wrap
    (None, 5, None),
    (5, None, None),
    (-1, 5, None),
])
def test_counter_delta(old: int | None, new: int | None, want: int | None) -> None:
    assert counter_delta(old, new) == want


def test_rate() -> None:
    assert rate(0, 1000, 2.0) == 500.0
    assert rate(0, 1000, 0.0) is None
    assert rate(0, 1000, -1.0) is None
    assert rate(WRAP32 - 10, 10, 1.0) == 20.0
    assert rate(2**40, 0, 1.0) is None


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1),
       st.floats(0.001, 1000, allow_nan=False))
def test_rate_never_negative(old: int, new: int, dt: float) -> None:
    r = rate(old, new, dt)
    assert r is None or r >= 0
