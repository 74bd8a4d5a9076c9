"""What every trainguard dashboard shares: the frame, the datasource, job/node/rank variables,
incident annotations and the links between the dashboards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grafanalib.core import Annotations, Dashboard, DashboardLink, Template, Templating, Time

from trainguard.dashboards.datasource import UID, ref, variable

RATE = "$__rate_interval"
TAGS = ["trainguard"]
ALL = ".*"
# The job's ranks as trainguard sees them on nodes and GPUs: node/rank variables and the join of
# dcgm-exporter's series (relabelled Hostname -> node, see deploy/prometheus/prometheus.yml).
RANKS = 'trainguard_rank_info{job_id="$job", node=~"$node", rank=~"$rank"}'
# The served incident pages (`trainguard incident serve --http-port`): a text variable, so each
# Grafana sets its own base URL (or its proxy's); the default is docker-compose.yml's published
# address of the incidents service.
TIMELINE = "timeline"
TIMELINE_DEFAULT = "http://localhost:8470"


def job_variable() -> Template:
    return Template(name="job", label="job", dataSource=UID,
                    query="label_values(trainguard_job_last_step, job_id)", refresh=2, sort=1)


def node_variable() -> Template:
    return Template(name="node", label="node", dataSource=UID,
                    query='label_values(trainguard_rank_info{job_id="$job"}, node)', refresh=2,
                    sort=1, multi=True, includeAll=True, allValue=ALL,
                    default="$__all")


def rank_variable() -> Template:
    return Template(name="rank", label="rank", dataSource=UID,
                    query='label_values(trainguard_rank_info{job_id="$job", node=~"$node"}, '
                          "rank)", refresh=2, sort=3, multi=True, includeAll=True,
                    allValue=ALL, default="$__all")


def timeline_variable() -> Template:
    return Template(name=TIMELINE, label="timeline pages", query=TIMELINE_DEFAULT,
                    default=TIMELINE_DEFAULT, type="textbox", hide=2)


def job_variables() -> list[Template]:
    return [variable(), job_variable(), node_variable(), rank_variable()]


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


def links() -> list[DashboardLink]:
    """Every trainguard dashboard, as a menu keeping the time range and the variables, and the
    served incident list (each incident's timeline page is linked from there)."""
    return [DashboardLink(title="trainguard", type="dashboards", tags=list(TAGS),
                          asDropdown=True, includeVars=True, keepTime=True),
            DashboardLink(title="Incident timelines", type="link", uri=f"${{{TIMELINE}}}/",
                          icon="doc", keepTime=False, targetBlank=True,
                          tooltip="the incident list and timeline pages (incident serve)")]


def dashboard(uid: str, title: str, description: str, panels: Sequence[Any], *,
              variables: Sequence[Template] = (),
              annotations: Sequence[dict[str, Any]] = ()) -> Dashboard:
    names = {v.name for v in variables}
    all_vars = list(variables) if "datasource" in names else [variable(), *variables]
    all_vars.append(timeline_variable())
    return Dashboard(
        uid=uid, title=title, description=description, tags=TAGS, timezone="utc",
        refresh="10s", time=Time("now-1h", "now"), panels=list(panels),
        templating=Templating(list=all_vars), links=links(),
        annotations=Annotations(list=list(annotations)),
    ).auto_panel_ids()
