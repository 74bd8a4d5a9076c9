"""The one Prometheus datasource every panel uses, as Grafana's {type, uid} reference.

The uid is fixed by deploy/grafana/provisioning/datasources/prometheus.yml.
"""

from __future__ import annotations

PROMETHEUS_UID = "prometheus"
PROMETHEUS_TYPE = "prometheus"


def ref() -> dict[str, str]:
    return {"type": PROMETHEUS_TYPE, "uid": PROMETHEUS_UID}
