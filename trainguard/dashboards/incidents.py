"""Incidents: transitions (also as annotations), recovery times, actions and their outcomes."""

from __future__ import annotations

from grafanalib.core import Dashboard

from trainguard.dashboards.common import RATE, dashboard, incident_annotation
from trainguard.dashboards.panels import Grid, heatmap, stat, table, timeseries
from trainguard.events.payloads import IncidentState

END = "|".join(s.value for s in IncidentState if not s.active)


def build() -> Dashboard:
    g = Grid()
    g.add(stat("Open incidents", "trainguard_incidents_open"), w=6, h=4)
    g.add(stat("Oldest open incident, age",
               "(time() - trainguard_incident_oldest_open_detected_timestamp_seconds)"
               " and on() (trainguard_incidents_open > 0)", unit="s"), w=6, h=4)
    g.add(stat("Escalated or unrecoverable",
               'sum(trainguard_incident_transitions_total{state=~"escalated|unrecoverable"})'),
          w=6, h=4)
    g.add(stat("Recovered", 'sum(trainguard_incident_transitions_total{state="recovered"})'),
          w=6, h=4)
    g.add(timeseries("Transitions by state",
                     [(f"sum by (state) (increase(trainguard_incident_transitions_total[{RATE}]))",
                       "{{state}}")]))
    g.add(timeseries("Recovery time (detected -> recovered)", [
        (f"histogram_quantile({q}, sum by (le) "
         f"(rate(trainguard_incident_recovery_seconds_bucket[{RATE}])))", f"p{int(q * 100)}")
        for q in (0.5, 0.9, 0.99)], unit="s"))
    g.add(heatmap("Recovery time distribution",
                  f"sum by (le) (increase(trainguard_incident_recovery_seconds_bucket[{RATE}]))",
                  "{{le}}", unit="s", buckets=True))
    g.add(timeseries("Actions by tier",
                     [(f"sum by (tier, action) (increase(trainguard_commands_total[{RATE}]))",
                       "tier {{tier}}: {{action}}")]))
    g.add(timeseries("Outcomes that did not succeed",
                     [(f'sum by (action, status) (increase(trainguard_command_outcomes_total'
                       f'{{status!~"done|accepted"}}[{RATE}]))', "{{action}} {{status}}")]))
    g.add(table("Latest transition per job and state",
                [("trainguard_incident_last_transition_timestamp_seconds * 1000", "")],
                unit="dateTimeAsIso"))
    return dashboard("tg-incidents", "trainguard / Incidents",
                     f"Incidents from detection to {END.replace('|', ', ')}.", g.panels,
                     annotations=[incident_annotation()])
