"""Every dashboard, as the JSON files Grafana provisions (the top-level dashboards/)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafanalib.core import Dashboard

from trainguard.dashboards import fleet, gpu, incidents, job, pipeline
from trainguard.dashboards.grafana_json import to_grafana_json

BUILDERS: dict[str, Callable[[], Dashboard]] = {
    "fleet-overview": fleet.build,
    "job": job.build,
    "gpu": gpu.build,
    "incidents": incidents.build,
    "pipeline-health": pipeline.build,
}


def build_all() -> dict[str, dict[str, Any]]:
    """File name -> dashboard JSON document."""
    return {f"{name}.json": to_grafana_json(build()) for name, build in BUILDERS.items()}


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def write_all(out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, doc in build_all().items():
        path = out / name
        path.write_text(render(doc))
        written.append(path)
    return written
