"""Bounded cardinality for job-keyed series: a series whose job went silent is removed.

Each labelled gauge child is remembered with the event time that last set it; ``sweep`` removes
those older than the TTL, so finished jobs leave /metrics instead of piling up.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import Gauge

SeriesKey = tuple[Gauge, tuple[str, ...]]


@dataclass
class SeriesExpiry:
    ttl_us: int
    _last: dict[SeriesKey, int] = field(default_factory=dict)

    def set(self, gauge: Gauge, labels: tuple[str, ...], value: float, event_time: int) -> None:
        gauge.labels(*labels).set(value)
        key = (gauge, labels)
        self._last[key] = max(event_time, self._last.get(key, event_time))

    def remove(self, gauge: Gauge, labels: tuple[str, ...]) -> None:
        if self._last.pop((gauge, labels), None) is not None:
            gauge.remove(*labels)

    def sweep(self, now_us: int) -> int:
        """Remove every series last set before ``now_us - ttl``; returns how many went."""
        stale = [k for k, t in self._last.items() if t < now_us - self.ttl_us]
        for gauge, labels in stale:
            self.remove(gauge, labels)
        return len(stale)

    def __len__(self) -> int:
        return len(self._last)
