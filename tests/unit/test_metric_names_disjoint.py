"""No counter exported twice: the metric names of every service's /metrics (the metrics
service's PipelineMetrics, the agent's, alerts', and decide's and the actuators' module
metrics) are disjoint, so a sum over every Prometheus target counts each thing once. The
modules that define metrics are found by scanning the package: a new one must be listed."""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable
from pathlib import Path

import pytest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from trainguard.actuators import metrics as actuator_metrics
from trainguard.agent.metrics import AgentMetrics
from trainguard.alerts.metrics import AlertMetrics
from trainguard.metrics.registry import PipelineMetrics

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
KINDS = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}
# modules that import a metric kind without defining metrics of their own
HELPERS = {"trainguard/metrics/expiry.py"}  # expires PipelineMetrics' gauges


def _names(collectors: Iterable[Collector]) -> set[str]:
    """Every sample name they export (a counter's _total and _created, a histogram's
    _bucket/_sum/_count), whether or not a labelled series exists yet."""
    out: set[str] = set()
    for c in collectors:
        for family in c.collect():
            out.add(family.name)
            kind = family.type
            suffixes = {"counter": ("_total", "_created"), "gauge": ("",),
                        "histogram": ("_bucket", "_sum", "_count", "_created"),
                        "summary": ("_sum", "_count", "_created"), "info": ("_info",)}
            out |= {family.name + s for s in suffixes.get(kind, ("",))}
    return out


def _module_metrics() -> list[Collector]:
    return [v for v in vars(actuator_metrics).values() if isinstance(v, MetricWrapperBase)]


def exported() -> dict[str, set[str]]:
    return {
        "metrics serve": _names([PipelineMetrics().registry]),
        "agent": _names([AgentMetrics().registry]),
        "alerts": _names([AlertMetrics().registry]),
        # one module, two services: decide counts commands issued, the actuator outcomes
        "decide/actuator": _names(_module_metrics()),
    }


SOURCES = {"trainguard/metrics/registry.py", "trainguard/agent/metrics.py",
           "trainguard/alerts/metrics.py", "trainguard/actuators/metrics.py"}


def _defining_modules() -> set[str]:
    found = set()
    for path in (ROOT / "trainguard").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                    "prometheus_client") and {a.name for a in node.names} & KINDS:
                found.add(str(path.relative_to(ROOT)))
    return found - HELPERS


def test_every_module_that_defines_metrics_is_compared() -> None:
    assert _defining_modules() == SOURCES


def test_each_service_exports_its_counters() -> None:
    names = exported()
    assert all(names.values()), names
    assert "trainguard_commands_total" in names["metrics serve"]
    assert "trainguard_decide_commands_issued_total" in names["decide/actuator"]


@pytest.mark.parametrize("a,b", list(itertools.combinations(
    ["metrics serve", "agent", "alerts", "decide/actuator"], 2)))
def test_no_metric_name_is_exported_by_two_services(a: str, b: str) -> None:
    names = exported()
    assert not names[a] & names[b], sorted(names[a] & names[b])
