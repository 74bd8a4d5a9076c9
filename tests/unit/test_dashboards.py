"""Dashboards: Grafana's published schema, the provisioned datasource, the committed JSON, and
metric names that some service really exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped,unused-ignore]
import pytest
import yaml
from grafanalib._gen import DashboardEncoder

from trainguard.agent.metrics import AgentMetrics
from trainguard.dashboards.build import BUILDERS, build_all, render
from trainguard.dashboards.queries import expressions, substitute
from trainguard.metrics.registry import PipelineMetrics

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT.parent / "shared" / "schemas" / "grafana-dashboard.jsonschema.json"
DCGM_COUNTERS = ROOT.parent / "shared" / "data" / "dcgm" / "dcgm-exporter_default-counters.csv"
VALUES = {"job": "job-1", "node": ".*", "rank": ".*"}
DOCS = build_all()


def _validator() -> jsonschema.Draft7Validator:
    assert SCHEMA.exists(), f"Grafana's dashboard schema is missing: {SCHEMA}"
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("name", sorted(DOCS))
def test_every_dashboard_validates_against_grafanas_schema(name: str) -> None:
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:200]}"
              for e in _validator().iter_errors(DOCS[name])]
    assert not errors, "\n".join(errors)


def test_grafanalibs_raw_output_would_not_validate() -> None:
    """The rewrite in grafana_json.py is what makes them valid (so the test above can fail)."""
    raw = json.loads(json.dumps(BUILDERS["job"]().to_json_data(), cls=DashboardEncoder))
    assert list(_validator().iter_errors(raw))


def test_five_dashboards_with_unique_uids_and_panel_ids() -> None:
    assert set(DOCS) == {"fleet-overview.json", "job.json", "gpu.json", "incidents.json",
                         "pipeline-health.json"}
    assert len({d["uid"] for d in DOCS.values()}) == 5
    for doc in DOCS.values():
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids))


def _refs(node: Any) -> list[Any]:
    if isinstance(node, dict):
        found = [node["datasource"]] if "datasource" in node else []
        return found + [r for v in node.values() for r in _refs(v)]
    if isinstance(node, list):
        return [r for v in node for r in _refs(v)]
    return []


def test_every_datasource_reference_is_the_datasource_variable() -> None:
    """No hard-coded uid: each dashboard picks its Prometheus (the provisioned one by default),
    so it fits a Grafana that already has its own."""
    prov = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml")
                          .read_text())["datasources"]
    assert prov[0]["type"] == "prometheus"
    for name, doc in DOCS.items():
        refs = _refs(doc)
        assert refs, name
        assert all(r == {"type": "prometheus", "uid": "${datasource}"} for r in refs), (name, refs)
        ds = [v for v in doc["templating"]["list"] if v["name"] == "datasource"]
        assert ds and ds[0]["type"] == "datasource" and ds[0]["query"] == "prometheus", name


def test_every_dashboard_links_to_the_others() -> None:
    for name, doc in DOCS.items():
        links = doc.get("links", [])
        assert any(link.get("type") == "dashboards" and "trainguard" in link.get("tags", [])
                   and link.get("keepTime") and link.get("includeVars") for link in links), name


def test_every_dashboard_links_to_the_served_timelines() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    published = compose["services"]["incidents"]["ports"][0].split(":")[-2]
    for name, doc in DOCS.items():
        urls = [link["url"] for link in doc.get("links", []) if link.get("type") == "link"]
        assert urls == ["${timeline}/"], (name, urls)
        var = next(v for v in doc["templating"]["list"] if v["name"] == "timeline")
        # the default is where compose publishes `incident serve --http-port`
        assert var["type"] == "textbox" and var["query"] == f"http://localhost:{published}", var


def test_committed_dashboards_are_the_built_ones() -> None:
    out = ROOT / "dashboards"
    for name, doc in DOCS.items():
        path = out / name
        assert path.exists() and path.read_text() == render(doc), (
            f"{path} is stale: run `trainguard dashboards build --out dashboards`")


def _exported_names() -> set[str]:
    names = {"up"}
    for registry in (PipelineMetrics().registry, AgentMetrics().registry):
        for family in registry.collect():
            names.add(family.name)
            names.update(f"{family.name}{s}" for s in ("_total", "_bucket", "_sum", "_count"))
    return names


def _dcgm_defaults() -> set[str]:
    """The metrics dcgm-exporter exports by default (its etc/default-counters.csv)."""
    assert DCGM_COUNTERS.exists(), DCGM_COUNTERS
    return {line.split(",")[0].strip() for line in DCGM_COUNTERS.read_text().splitlines()
            if line.strip().startswith("DCGM_")}


def test_every_queried_metric_is_exported_by_trainguard_or_dcgm_exporter() -> None:
    exported = _exported_names()
    dcgm = _dcgm_defaults()
    for name, doc in DOCS.items():
        for q in expressions(doc):
            used = set(re.findall(r"\btrainguard_\w+|\bup(?=\{)", q.expr))
            gpu = set(re.findall(r"\bDCGM_\w+", q.expr))
            assert used or gpu, (name, q)
            assert used <= exported, (name, q.where, used - exported)
            assert gpu <= dcgm, (name, q.where, gpu - dcgm)


def test_the_gpu_dashboard_joins_dcgm_series_to_ranks() -> None:
    exprs = [q.expr for q in expressions(DOCS["gpu.json"])]
    names = {n for e in exprs for n in re.findall(r"\bDCGM_\w+", e)}
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS",
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"} <= names
    joined = [e for e in exprs if "group_left(job_id, rank)" in e]
    assert len(joined) >= 8
    assert all("on(node, gpu)" in e and "trainguard_rank_info" in e for e in joined)


def test_every_panel_has_a_query_and_variables_substitute() -> None:
    for doc in DOCS.values():
        panels = [p for p in doc["panels"] if p["type"] != "row"]
        assert all(p.get("targets") for p in panels)
        for q in expressions(doc):
            assert "$" not in substitute(q.expr, VALUES)
    with pytest.raises(KeyError, match=r"\$nope"):
        substitute("x{a=\"$nope\"}", {})


def test_job_view_has_a_per_rank_heatmap_and_the_straggler_ratio() -> None:
    job = DOCS["job.json"]
    heat = [p for p in job["panels"] if p["type"] == "heatmap"]
    assert heat and "trainguard_step_compute_seconds" in heat[0]["targets"][0]["expr"]
    assert heat[0]["targets"][0]["legendFormat"] == "{{rank}}"
    assert any("trainguard_straggler_ratio" in t["expr"] for p in job["panels"]
               for t in p.get("targets", []))


def test_incident_annotations_use_transition_event_times() -> None:
    for name in ("incidents.json", "job.json", "fleet-overview.json"):
        ann = DOCS[name]["annotations"]["list"]
        assert ann and ann[0]["useValueForTime"] is True
        assert "trainguard_incident_last_transition_timestamp_seconds" in ann[0]["expr"]
