"""What a bus raises that its callers handle (kept apart from the Protocol and the clients,
which both use it)."""

from __future__ import annotations


class Fenced(RuntimeError):
    """A producer made by ``Bus.fenced_producer`` was fenced: another one with the same fence
    id started after it. It may publish nothing more; what it had not committed is never
    read (consumers read committed records only)."""
