"""What the streams app needs from the rules: one engine per job, fed events in order, whose
state can be written to a faust table and read back after a restart."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from trainguard.events.envelope import Event


class JobEngine(Protocol):
    def feed(self, event: Event, spooled_us: int = 0) -> Sequence[Event]:
        """Take one event of this job (``spooled_us``: how long its record waited in an
        agent's spool, from its header); return the verdict events it decides."""
        ...

    def early(self, event: Event) -> Sequence[Event]:
        """Take an urgent copy of one of this job's events (the original comes in order with
        ``feed``); return the verdicts decided at once, before their turn."""
        ...

    def snapshot(self, *, events: bool = True) -> dict[str, Any]:
        """The whole state, JSON-serialisable; ``events=False``: the events waiting in the
        reorder buffer by id only (``snapshot["buffer"]["ids"]``), to be put back as wire JSON
        objects in ``snapshot["buffer"]["buffered"]`` before the factory restores it."""
        ...

    def buffered_ids(self) -> set[str]:
        """Ids of the events waiting in the reorder buffer."""
        ...


# job id, saved snapshot (None for a new job) -> engine
EngineFactory = Callable[[str, dict[str, Any] | None], JobEngine]
