"""Fleet overview: is the loop healthy, what is it finding and fixing, across every job."""

from __future__ import annotations

from grafanalib.core import Dashboard

from trainguard.dashboards.common import RATE, dashboard, incident_annotation
from trainguard.dashboards.panels import Grid, stat, timeseries


def build() -> Dashboard:
    g = Grid()
    g.add(stat("Open incidents", "trainguard_incidents_open"), w=6, h=4)
    g.add(stat("Agents up", 'sum(up{job="trainguard-agent"})'), w=6, h=4)
    g.add(stat("Agents reaching Kafka", "sum(trainguard_agent_broker_up)"), w=6, h=4)
    g.add(stat("Recoveries", "sum(trainguard_incident_recovery_seconds_count)"), w=6, h=4)
    g.row("Findings and actions")
    g.add(timeseries("Events/s by type",
                     [(f"sum by (type) (rate(trainguard_events_total[{RATE}]))", "{{type}}")],
                     unit="ops"))
    g.add(timeseries("Verdicts opened by kind",
                     [(f'sum by (kind, severity) (rate(trainguard_verdicts_total{{state="open"}}'
                       f"[{RATE}]))", "{{kind}} ({{severity}})")], unit="ops"))
    g.add(timeseries("Commands by action and tier",
                     [(f"sum by (action, tier) (increase(trainguard_commands_total[{RATE}]))",
                       "{{action}} (tier {{tier}})")]))
    g.add(timeseries("Outcomes by status",
                     [(f"sum by (status) (increase(trainguard_command_outcomes_total[{RATE}]))",
                       "{{status}}")]))
    g.row("Recovery and progress")
    g.add(timeseries("Recovery time (detected -> recovered)", [
        (f"histogram_quantile(0.5, sum by (le) (rate(trainguard_incident_recovery_seconds_bucket"
         f"[{RATE}])))", "p50"),
        (f"histogram_quantile(0.95, sum by (le) "
         f"(rate(trainguard_incident_recovery_seconds_bucket[{RATE}])))", "p95")], unit="s"))
    g.add(timeseries("Latest step per job", [("trainguard_job_last_step", "{{job_id}}")]))
    g.add(timeseries("Agent spool depth", [("trainguard_agent_spool_depth_records",
                                            "{{instance}}")]))
    g.add(timeseries("Records published by agents/s",
                     [(f"sum by (type) (rate(trainguard_agent_records_published_total[{RATE}]))",
                       "{{type}}")], unit="ops"))
    return dashboard("tg-fleet", "trainguard / Fleet overview",
                     "Every job: events, verdicts, actions, recoveries, agents.", g.panels,
                     annotations=[incident_annotation()])
