"""The few numbers that shape incidents; defaults and reasons in docs/incidents.md."""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.events.payloads import Severity

SOURCE = "trainguard.incidents"


@dataclass(frozen=True)
class IncidentSettings:
    # A verdict decided this soon after an active incident opened joins it (one fault, many
    # symptoms: a killed rank's peers exit too).
    join_window_us: int = 30_000_000
    # Verdicts below this severity never open an incident (they may join one).
    open_severity: Severity = Severity.WARNING
    # Live service only: event-time lateness of its reorder buffer. Verdicts come after the
    # streams' own 2 s buffer, commands after the verdicts: 15 s covers both with room.
    lateness_us: int = 15_000_000


SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}
