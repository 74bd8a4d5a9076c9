"""DCGM "blank" sentinels: what dcgm-exporter prints when DCGM has no value for a field.

From DCGM's ``dcgm_structs.h`` (``DCGM_BLANK_VALUES``): each type has a base blank and the next
few values name the reason (``+1`` not found, ``+2`` not supported, ``+3`` no permission, ...).
A reader checks ``value >= BLANK`` (``DCGM_INT*_IS_BLANK`` / ``DCGM_FP64_IS_BLANK``).

The Prometheus text does not say which DCGM type a series has, so every value is checked
against all three:

- int64 blank ``0x7ffffffffffffff0``: anything at or above it (as a float it rounds to 2**63)
  cannot be a real int64 reading;
- fp64 blank ``2**47`` (``140737488355328.0``; not 1.4e308): the 16 values ``2**47 + 0..15``;
  a real double reading there is not plausible for any field dcgm-exporter exports;
- int32 blank ``0x7ffffff0``: the 16 integral values ``2147483632..2147483647``; an int32
  field cannot go higher, and an int64 counter sitting exactly in that window is accepted as
  a (tiny) risk.
"""

from __future__ import annotations

import math

DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0
BLANK_SPAN = 16  # base blank plus the reason codes that follow it


def is_dcgm_blank(value: float) -> bool:
    """True when ``value`` (int or float, as the text parser gave it) is a DCGM blank."""
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return False
        if value >= float(DCGM_INT64_BLANK):
            return True
        if not value.is_integer():
            return DCGM_FP64_BLANK <= value < DCGM_FP64_BLANK + BLANK_SPAN
        value = int(value)
    return (value >= DCGM_INT64_BLANK
            or DCGM_FP64_BLANK <= value < DCGM_FP64_BLANK + BLANK_SPAN
            or DCGM_INT32_BLANK <= value < DCGM_INT32_BLANK + BLANK_SPAN)
