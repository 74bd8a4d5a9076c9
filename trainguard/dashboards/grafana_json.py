"""grafanalib's output -> JSON that Grafana's published dashboard schema accepts.

grafanalib (0.7) still writes the pre-Grafana-7 model: datasource names as strings, nulls for
unset options, legacy panel and dashboard keys (``span``, ``height``, ``rows``, ``style``...),
``"steps": ""`` thresholds. This module rewrites exactly those, explicitly:
- datasource references become ``{"type", "uid"}`` objects (panels, targets, variables,
  annotations);
- unset (null) values are left out, except a threshold's base value, which is null by design;
- keys outside Grafana's current dashboard, panel, row, field-config, variable and time-picker
  models are dropped (lists below);
- thresholds always carry a list of steps, starting with the base (null) step.
"""

from __future__ import annotations

import json
from typing import Any

from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard

from trainguard.dashboards.datasource import PROMETHEUS_UID, UID, ref

DASHBOARD_KEYS = frozenset({
    "id", "uid", "title", "description", "revision", "tags", "timezone", "editable",
    "graphTooltip", "time", "timepicker", "fiscalYearStartMonth", "liveNow", "weekStart",
    "refresh", "schemaVersion", "version", "panels", "templating", "annotations", "links"})
PANEL_KEYS = frozenset({
    "type", "id", "pluginVersion", "targets", "title", "description", "transparent",
    "datasource", "gridPos", "links", "repeat", "repeatDirection", "maxPerRow", "maxDataPoints",
    "transformations", "interval", "timeFrom", "timeShift", "hideTimeOverride", "libraryPanel",
    "cacheTimeout", "queryCachingTTL", "options", "fieldConfig"})
ROW_KEYS = frozenset({"type", "collapsed", "title", "datasource", "gridPos", "id", "panels",
                      "repeat"})
FIELD_DEFAULT_KEYS = frozenset({
    "displayName", "displayNameFromDS", "description", "path", "writeable", "filterable",
    "unit", "decimals", "min", "max", "mappings", "thresholds", "color", "links", "actions",
    "noValue", "custom", "fieldMinMax"})
VARIABLE_KEYS = frozenset({
    "type", "name", "label", "hide", "skipUrlSync", "description", "query", "datasource",
    "current", "multi", "allowCustomValue", "options", "refresh", "sort", "includeAll",
    "allValue", "regex", "definition"})
TIMEPICKER_KEYS = frozenset({"hidden", "refresh_intervals", "quick_ranges", "nowDelay"})
SCHEMA_VERSION = 39  # Grafana 11.1; older versions would be migrated on load
BASE_STEP = {"color": "green", "value": None}


def to_grafana_json(dashboard: Dashboard) -> dict[str, Any]:
    raw = json.loads(json.dumps(dashboard.to_json_data(), cls=DashboardEncoder))
    doc = _only(_no_nulls(raw), DASHBOARD_KEYS)
    doc["schemaVersion"] = SCHEMA_VERSION
    doc["panels"] = [_panel(p) for p in doc.get("panels", [])]
    doc["timepicker"] = _only(doc.get("timepicker", {}), TIMEPICKER_KEYS)
    doc["templating"] = {"list": [_variable(v) for v in doc.get("templating", {})
                                  .get("list", [])]}
    doc["annotations"] = {"list": [_annotation(a) for a in doc.get("annotations", {})
                                   .get("list", [])]}
    return doc


def _no_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _no_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_nulls(v) for v in value]
    return value


def _only(d: dict[str, Any], keys: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k in keys}


def _ds(value: Any) -> dict[str, str]:
    if isinstance(value, dict):
        return {k: str(v) for k, v in value.items() if k in ("type", "uid")}
    if value in (None, UID, PROMETHEUS_UID, "Prometheus", "default"):
        return ref()
    raise ValueError(f"datasource: only the Prometheus datasource is provisioned (got {value!r})")


def _panel(p: dict[str, Any]) -> dict[str, Any]:
    if p.get("type") == "row":
        row = _only(p, ROW_KEYS)
        row.setdefault("collapsed", False)
        row["panels"] = [_panel(c) for c in row.get("panels", [])]
        row.pop("datasource", None)
        return row
    out = _only(p, PANEL_KEYS)
    out["datasource"] = _ds(out.get("datasource"))
    out["targets"] = [{**t, "datasource": _ds(t.get("datasource"))}
                      for t in out.get("targets", [])]
    out["fieldConfig"] = _field_config(out.get("fieldConfig", {}))
    if "repeat" not in out:
        out.pop("repeatDirection", None)
        out.pop("maxPerRow", None)
    return out


def _field_config(fc: dict[str, Any]) -> dict[str, Any]:
    defaults = _only(fc.get("defaults", {}), FIELD_DEFAULT_KEYS)
    th = defaults.get("thresholds", {})
    steps = th.get("steps") if isinstance(th, dict) else None
    if not isinstance(steps, list) or not steps:
        steps = [dict(BASE_STEP)]
    defaults["thresholds"] = {"mode": th.get("mode", "absolute") if isinstance(th, dict)
                              else "absolute", "steps": steps}
    color = defaults.get("color")
    if not isinstance(color, dict) or "mode" not in color:
        defaults.pop("color", None)
    return {"defaults": defaults, "overrides": list(fc.get("overrides", []))}


def _variable(v: dict[str, Any]) -> dict[str, Any]:
    out = _only(v, VARIABLE_KEYS)
    if out.get("type") == "datasource":
        out.pop("datasource", None)
    elif "datasource" in out or out.get("type") == "query":
        out["datasource"] = _ds(out.get("datasource"))
    current = out.get("current")
    if isinstance(current, dict) and "text" in current and "value" in current:
        out["current"] = {k: current[k] for k in ("selected", "text", "value") if k in current}
    else:
        out.pop("current", None)
    return out


def _annotation(a: dict[str, Any]) -> dict[str, Any]:
    out = dict(a)
    if "datasource" in out:
        out["datasource"] = _ds(out["datasource"])
    return out
