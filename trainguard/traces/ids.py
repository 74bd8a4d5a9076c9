"""Trace and span ids derived from the incident id, so a replay yields the same trace."""

from __future__ import annotations

from trainguard.events.ids import derived_id


def trace_id_for(incident_id: str) -> int:
    """A 128-bit trace id from the incident id (never 0, which OpenTelemetry calls invalid)."""
    return int(derived_id("otel-trace", incident_id), 16) or 1


def span_id_for(incident_id: str, key: str) -> int:
    """A 64-bit span id from the incident id and the span's key within it (never 0)."""
    return int(derived_id("otel-span", incident_id, key)[:16], 16) or 1
