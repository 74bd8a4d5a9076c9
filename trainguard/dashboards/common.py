"""What every trainguard dashboard shares: the frame, the job variable, incident annotations."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafanalib.core import Annotations, Dashboard, Template, Templating, Time

from trainguard.dashboards.datasource import PROMETHEUS_UID, ref

RATE = "$__rate_interval"
TAGS = ["trainguard"]


def job_variable() -> Template:
    return Template(name="job", label="job", dataSource=PROMETHEUS_UID,
                    query="label_values(trainguard_step_compute_ms, job_id)", refresh=2, sort=1)


def incident_annotation(job_selector: str = "") -> dict[str, Any]:
    """Incident transitions on every time axis, each at its event time.

    The metrics service keeps, per job and state, the event time of the latest transition into
    that state; read with ``useValueForTime`` each one becomes an annotation at that time.
    """
    sel = f"{{{job_selector}}}" if job_selector else ""
    return {
        "name": "Incident transitions",
        "datasource": ref(),
        "enable": True,
        "iconColor": "red",
        "expr": f"trainguard_incident_last_transition_timestamp_seconds{sel} * 1000",
        "step": "15s",
        "titleFormat": "incident {{state}}",
        "textFormat": "job {{job_id}}: incident {{state}}",
        "tagKeys": "job_id,state",
        "useValueForTime": True,
    }


def dashboard(uid: str, title: str, description: str, panels: Sequence[Any], *,
              variables: Sequence[Template] = (),
              annotations: Sequence[dict[str, Any]] = ()) -> Dashboard:
    return Dashboard(
        uid=uid, title=title, description=description, tags=TAGS, timezone="utc",
        refresh="10s", time=Time("now-1h", "now"), panels=list(panels),
        templating=Templating(list=list(variables)),
        annotations=Annotations(list=list(annotations)),
    ).auto_panel_ids()
