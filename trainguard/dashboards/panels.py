"""Small panel builders on grafanalib, laid out left to right on Grafana's 24-column grid."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grafanalib.core import GridPos, Heatmap, RowPanel, Stat, Table, Target, TimeSeries

from trainguard.dashboards.datasource import UID

Query = tuple[str, str]  # (PromQL, legend format)


def targets(queries: Sequence[Query], *, fmt: str = "time_series",
            instant: bool = False) -> list[Target]:
    return [Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + i), format=fmt,
                   instant=instant, datasource=UID)
            for i, (expr, legend) in enumerate(queries)]


def timeseries(title: str, queries: Sequence[Query], *, unit: str = "short",
               description: str = "") -> TimeSeries:
    return TimeSeries(title=title, description=description, dataSource=UID,
                      targets=targets(queries), unit=unit)


def stat(title: str, expr: str, *, unit: str = "none", description: str = "") -> Stat:
    return Stat(title=title, description=description, dataSource=UID,
                targets=targets([(expr, "")]), format=unit, reduceCalc="lastNotNull")


def table(title: str, queries: Sequence[Query], *, unit: str = "", description: str = "",
          ) -> Table:
    return Table(title=title, description=description, dataSource=UID,
                 targets=targets(queries, fmt="table", instant=True), unit=unit)


def heatmap(title: str, expr: str, legend: str, *, unit: str = "ms", description: str = "",
            buckets: bool = False) -> Heatmap:
    """A heatmap of series as rows (``buckets=False``: one row per series, e.g. per rank) or of
    a Prometheus histogram's buckets (``buckets=True``)."""
    options: dict[str, Any] = {
        "calculate": False,
        "cellGap": 1,
        "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64, "exponent": 0.5,
                  "fill": "dark-orange", "reverse": False, "scale": "exponential"},
        "yAxis": {"axisPlacement": "left", "unit": unit if buckets else "", "reverse": False},
        "rowsFrame": {"layout": "le" if buckets else "unknown"},
        "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": False},
        "legend": {"show": True},
        "cellValues": {"unit": "short" if buckets else unit},
        "exemplars": {"color": "rgba(255,0,255,0.7)"},
        "filterValues": {"le": 1e-9},
        "showValue": "auto",
    }
    return Heatmap(title=title, description=description, dataSource=UID,
                   targets=targets([(expr, legend)], fmt="heatmap" if buckets else "time_series"),
                   dataFormat="tsbuckets", extraJson={"options": options})


@dataclass
class Grid:
    """Places panels left to right, wrapping at 24 columns; rows start a new line."""

    panels: list[Any] = field(default_factory=list)
    _x: int = 0
    _y: int = 0
    _row_h: int = 0

    def add(self, panel: Any, w: int = 12, h: int = 8) -> Grid:
        if self._x + w > 24:
            self._newline()
        panel.gridPos = GridPos(h=h, w=w, x=self._x, y=self._y)
        self.panels.append(panel)
        self._x += w
        self._row_h = max(self._row_h, h)
        return self

    def row(self, title: str) -> Grid:
        self._newline()
        self.panels.append(RowPanel(title=title, gridPos=GridPos(h=1, w=24, x=0, y=self._y)))
        self._y += 1
        return self

    def _newline(self) -> None:
        if self._x:
            self._y += self._row_h
        self._x, self._row_h = 0, 0
