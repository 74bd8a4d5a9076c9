"""Incident traces: one OpenTelemetry trace per incident, one span per phase, in event time."""
