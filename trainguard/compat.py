"""What the services need from Python 3.11+ on the Pythons they support (3.10-3.13).

One place for it, so the rest of the code reads as if every interpreter had it.
"""

from __future__ import annotations

import re
import sys
from datetime import datetime, timezone

#: datetime.UTC of 3.11.
UTC = timezone.utc

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - exercised by the 3.10 unit tier
    from enum import Enum

    class StrEnum(str, Enum):
        """enum.StrEnum of 3.11: members are str; str() and format() give the value."""

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)

        @staticmethod
        def _generate_next_value_(name: str, start: int, count: int,
                                  last_values: list[str]) -> str:
            return name.lower()

_FRACTION = re.compile(r"(T|\s)(\d{2}:\d{2}:\d{2})\.(\d+)")


def fromisoformat(text: str) -> datetime:
    """datetime.fromisoformat as 3.11 reads it: a trailing ``Z`` and 1-9 fraction digits too.

    On 3.10 the fraction is padded or cut to 6 digits and ``Z`` becomes ``+00:00``; on 3.11+
    this is the standard function. Raises ValueError like it.
    """
    if sys.version_info >= (3, 11):
        return datetime.fromisoformat(text)
    s = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text  # pragma: no cover
    s = _FRACTION.sub(lambda m: f"{m[1]}{m[2]}.{(m[3] + '000000')[:6]}", s, count=1)
    return datetime.fromisoformat(s)


__all__ = ["UTC", "StrEnum", "fromisoformat"]
