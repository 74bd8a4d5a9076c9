"""Open incidents and their detection times, from incident.transition events alone."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from trainguard.events.payloads import IncidentState, IncidentTransition

END_STATES = frozenset(s for s in IncidentState if not s.active)


@dataclass
class OpenIncidents:
    """Incident id -> event time it was detected (or first seen), for incidents not yet ended.

    Bounded: past ``capacity`` the oldest entries are forgotten (a service restarted mid-incident
    sees that incident from its next transition on).
    """

    capacity: int = 10_000
    _detected: OrderedDict[str, int] = field(default_factory=OrderedDict)

    def apply(self, t: IncidentTransition, event_time: int) -> float | None:
        """Record one transition; the detected->recovered duration in seconds when it recovers."""
        if t.to_state in END_STATES:
            detected = self._detected.pop(t.incident_id, None)
            if t.to_state is IncidentState.RECOVERED and detected is not None:
                return max(0, event_time - detected) / 1e6
            return None
        if t.incident_id not in self._detected:
            self._detected[t.incident_id] = event_time
            while len(self._detected) > self.capacity:
                self._detected.popitem(last=False)
        elif t.to_state is IncidentState.DETECTED:
            self._detected[t.incident_id] = min(event_time, self._detected[t.incident_id])
        return None

    def count(self) -> int:
        return len(self._detected)

    def oldest_detected_us(self) -> int | None:
        return min(self._detected.values(), default=None)
