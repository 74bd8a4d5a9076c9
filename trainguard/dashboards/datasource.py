"""The Prometheus datasource every panel uses: a dashboard variable, so that the dashboards fit
any Grafana (pick the Prometheus that scrapes trainguard and dcgm-exporter) instead of a
hard-coded uid.

``PROMETHEUS_UID`` is the uid deploy/grafana/provisioning/datasources/prometheus.yml gives the
datasource it provisions; the variable lists every Prometheus datasource and starts on the
default one.
"""

from __future__ import annotations

from grafanalib.core import Template

PROMETHEUS_UID = "prometheus"
PROMETHEUS_TYPE = "prometheus"
VARIABLE = "datasource"
UID = "${" + VARIABLE + "}"


def ref() -> dict[str, str]:
    return {"type": PROMETHEUS_TYPE, "uid": UID}


def variable() -> Template:
    return Template(name=VARIABLE, label="Prometheus", query=PROMETHEUS_TYPE, type="datasource",
                    refresh=1, hide=0)
