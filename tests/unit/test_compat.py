"""trainguard.compat reads times and enums alike on every supported Python (3.10-3.13)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.compat import UTC, StrEnum, fromisoformat

pytestmark = pytest.mark.unit


class Colour(StrEnum):
    RED = "red"
    DARK_BLUE = "dark-blue"


def test_strenum_members_are_their_values() -> None:
    assert Colour.RED.upper() == "RED"  # a str method: members are str
    assert str(Colour.DARK_BLUE) == "dark-blue"
    assert f"{Colour.RED}/{Colour.DARK_BLUE:>10}" == "red/ dark-blue"
    assert Colour("dark-blue") is Colour.DARK_BLUE
    assert isinstance(Colour.RED, str)


@given(st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1),
                    timezones=st.just(UTC)),
       st.integers(min_value=1, max_value=9), st.sampled_from(["Z", "+00:00", "+02:30"]),
       st.sampled_from(["T", " "]))
def test_iso_times_with_any_fraction_and_zulu(dt: datetime, digits: int, zone: str,
                                              sep: str) -> None:
    frac = f"{dt.microsecond:06d}{'0' * 3}"[:digits]
    offset = timedelta(0) if zone in ("Z", "+00:00") else timedelta(hours=2, minutes=30)
    local = (dt + offset).replace(tzinfo=None)
    text = f"{local:%Y-%m-%d}{sep}{local:%H:%M:%S}.{frac}{zone}"
    got = fromisoformat(text)
    want = dt.replace(microsecond=int((frac + "000000")[:6]))
    assert got == want
    assert got.utcoffset() == offset


def test_plain_forms_and_errors() -> None:
    assert fromisoformat("2026-12-01T10:00:00Z") == datetime(2026, 12, 1, 10, tzinfo=UTC)
    assert fromisoformat("2026-12-01") == datetime(2026, 12, 1)
    assert fromisoformat("2026-12-01T10:00:00.5+01:00").tzinfo == timezone(timedelta(hours=1))
    with pytest.raises(ValueError):
        fromisoformat("yesterday")
