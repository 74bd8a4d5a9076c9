"""Pipeline health: throughput per topic, lags, dead letters, the agents' publishing."""

from __future__ import annotations

from grafanalib.core import Dashboard

from trainguard.dashboards.common import RATE, dashboard
from trainguard.dashboards.panels import Grid, stat, timeseries


def build() -> Dashboard:
    g = Grid()
    g.add(stat("Dead letters", "sum(trainguard_dlq_records_total)"), w=6, h=4)
    g.add(stat("Records behind (metrics consumer)", "sum(trainguard_consumer_lag_records)"),
          w=6, h=4)
    g.add(stat("Scrape targets up", 'sum(up{job=~"trainguard.*"})'), w=6, h=4)
    g.add(stat("Invalid records seen", "sum(trainguard_invalid_records_total)"), w=6, h=4)
    g.add(timeseries("Events/s by topic",
                     [(f"sum by (topic) (rate(trainguard_events_total[{RATE}]))", "{{topic}}")],
                     unit="ops"))
    g.add(timeseries("Ingest lag (ingest_time - event_time)", [
        (f"histogram_quantile({q}, sum by (topic, le) "
         f"(rate(trainguard_event_ingest_lag_seconds_bucket[{RATE}])))", f"p{int(q * 100)} "
         "{{topic}}") for q in (0.5, 0.99)], unit="s"))
    g.add(timeseries("Consumer lag by topic", [("trainguard_consumer_lag_records",
                                                "{{topic}}")]))
    g.add(timeseries("Consumer group lag (watched groups)",
                     [("sum by (group, topic) (trainguard_consumer_group_lag_records)",
                       "{{group}} {{topic}}")],
                     description="Groups named with `trainguard metrics serve --watch-group-id`."))
    g.add(timeseries("Dead letters by source topic and consumer",
                     [(f"sum by (source_topic, consumer) "
                       f"(increase(trainguard_dlq_records_total[{RATE}]))",
                       "{{source_topic}} / {{consumer}}")]))
    g.row("Agents")
    g.add(timeseries("Agent publish latency p99", [
        (f"histogram_quantile(0.99, sum by (instance, le) "
         f"(rate(trainguard_agent_publish_latency_seconds_bucket[{RATE}])))", "{{instance}}")],
        unit="s"), w=8)
    g.add(timeseries("Agent collect time p95", [
        (f"histogram_quantile(0.95, sum by (instance, le) "
         f"(rate(trainguard_agent_collect_seconds_bucket[{RATE}])))", "{{instance}}")],
        unit="s"), w=8)
    g.add(timeseries("Agent spool", [("trainguard_agent_spool_bytes", "{{instance}}")],
                     unit="bytes"), w=8)
    return dashboard("tg-pipeline", "trainguard / Pipeline health",
                     "Topics, lags, dead letters and the node agents.", g.panels)
