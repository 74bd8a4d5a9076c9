"""Turning a source's field dict into a ``GpuSample`` without ever raising, and counting bad input.

Every source first gathers plain values (``dict[str, object]``) and then calls
``build_sample``: a value the payload refuses (a 140 % utilisation, a negative count) is dropped
to ``None`` / its default and counted as ``<prefix>_out_of_range``; the rest of the sample stays.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import ValidationError

from trainguard.events.payloads import GpuSample

_FIELDS = frozenset(GpuSample.model_fields)


class MalformedLog:
    """Counts bad input by kind into a dict and logs the first one of each kind only."""

    def __init__(self, logger: logging.Logger, source: str) -> None:
        self._log = logger
        self._source = source
        self._logged: set[str] = set()

    def count(self, counts: dict[str, int], kind: str, detail: str = "", n: int = 1) -> None:
        counts[kind] = counts.get(kind, 0) + n
        if kind not in self._logged:
            self._logged.add(kind)
            self._log.warning("%s: malformed %s: %.200s (further ones only counted)",
                              self._source, kind, detail)


def bump(counts: dict[str, int], kind: str, n: int = 1) -> None:
    counts[kind] = counts.get(kind, 0) + n


def build_sample(fields: dict[str, Any], malformed: dict[str, int],
                 prefix: str) -> GpuSample | None:
    """``GpuSample(**fields)``, dropping fields that fail validation; None without a GPU index."""
    values = {k: v for k, v in fields.items() if k in _FIELDS}
    for _ in range(len(values) + 1):
        try:
            return GpuSample(**values)
        except ValidationError as exc:
            bad = {str(err["loc"][0]) for err in exc.errors() if err.get("loc")}
            if "index" in bad or not bad & values.keys():
                bump(malformed, f"{prefix}_bad_index")
                return None
            for name in bad & values.keys():
                del values[name]
                bump(malformed, f"{prefix}_out_of_range")
    return None
