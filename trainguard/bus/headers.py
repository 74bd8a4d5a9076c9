"""Kafka record headers the pipeline writes besides the event bytes.

``tg-spooled-ms``: how long an agent kept the record in its spool before this send, in whole
milliseconds, ASCII decimal. The agent writes it only when the wait was at least
``SPOOLED_REPORT_MS``; a record without it was sent as it came. The event bytes stay those the
agent spooled (its reconciliation after an outage compares them), so a fact known only at send
time travels beside them. The streams worker reads it to tell a backlog from live data
(``rules/ordering.py``, "Backlog hold"): an agent that was cut off from the broker sends a
minute of records in a second when it gets through, and they are not evidence that its
neighbours, still draining theirs, fell silent.

A header is outside input: ``spooled_us`` reads a missing, repeated or malformed one as no
wait (0) rather than failing the record, whose event is valid either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

SPOOLED_HEADER = "tg-spooled-ms"
SPOOLED_REPORT_MS = 500  # shorter waits are the spool's normal hand-off: not written
_MAX_DIGITS = 12  # ~31 years in ms: anything longer is not a wait

Headers = Sequence[tuple[str, bytes]] | Mapping[str, bytes] | None


def spooled_header(waited_ms: int) -> list[tuple[str, bytes]]:
    """The headers for a record that waited ``waited_ms`` in the spool (none if short)."""
    if waited_ms < SPOOLED_REPORT_MS:
        return []
    return [(SPOOLED_HEADER, str(int(waited_ms)).encode("ascii"))]


def spooled_us(headers: Headers) -> int:
    """The spool wait a record's headers state, in µs; 0 when they state none usable."""
    if not headers:
        return 0
    items = headers.items() if isinstance(headers, Mapping) else headers
    found = [value for key, value in items if key == SPOOLED_HEADER]
    if len(found) != 1:
        return 0
    raw = found[0]
    if not isinstance(raw, bytes) or not 0 < len(raw) <= _MAX_DIGITS or not raw.isdigit():
        return 0
    return int(raw) * 1000
