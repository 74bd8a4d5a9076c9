"""Grafana dashboards, written with grafanalib; ``build.py`` emits schema-valid JSON."""
