"""Every PromQL expression a dashboard runs: panel targets, annotations and variable queries,
with Grafana's variables substituted so that Prometheus itself can evaluate them."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

GRAFANA_DEFAULTS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<expr>.+),\s*)?(?P<label>\w+)\)$")
_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


@dataclass(frozen=True)
class PanelQuery:
    where: str  # "panel 'Title' A", "annotation 'Name'", "variable job"
    expr: str


def expressions(doc: Mapping[str, Any]) -> Iterator[PanelQuery]:
    for panel in _panels(doc.get("panels", [])):
        for t in panel.get("targets", []):
            if t.get("expr"):
                yield PanelQuery(f"panel {panel.get('title')!r} {t.get('refId', '')}",
                                 t["expr"])
    for a in doc.get("annotations", {}).get("list", []):
        if a.get("expr"):
            yield PanelQuery(f"annotation {a.get('name')!r}", a["expr"])
    for v in doc.get("templating", {}).get("list", []):
        query = v.get("query")
        if v.get("type") == "query" and isinstance(query, str):
            m = _LABEL_VALUES.match(query.strip())
            expr = (m.group("expr") or f'{{{m.group("label")}!=""}}') if m else query
            yield PanelQuery(f"variable {v.get('name')}", expr)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from _panels(p.get("panels", []))


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Replace ``$name`` / ``${name}`` with ``values`` (then Grafana's interval defaults);
    an unknown variable is an error naming it."""
    merged = {**GRAFANA_DEFAULTS, **values}

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in merged:
            raise KeyError(f"variable ${name} has no value (in {expr!r})")
        return merged[name]

    return _VAR.sub(one, expr)
