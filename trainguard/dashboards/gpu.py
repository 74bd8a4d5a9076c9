"""GPUs under a job: dcgm-exporter's own series, joined to job and rank.

dcgm-exporter labels each series with ``Hostname`` and ``gpu``; Prometheus relabels ``Hostname``
to ``node`` at scrape time (deploy/prometheus/prometheus.yml, job ``dcgm-exporter``) and the
metrics service exports ``trainguard_rank_info{job_id, rank, node, gpu} 1`` for every rank process
whose GPU it knows. ``* on(node, gpu) group_left(job_id, rank)`` then names each GPU's rank.
Metric names are dcgm-exporter's defaults (etc/default-counters.csv).
"""

from __future__ import annotations

from grafanalib.core import Dashboard

from trainguard.dashboards.common import (
    RANKS,
    RATE,
    dashboard,
    incident_annotation,
    job_variables,
)
from trainguard.dashboards.panels import Grid, table, timeseries

LEGEND = "rank {{rank}} ({{node}} gpu {{gpu}})"


def by_rank(expr: str) -> str:
    """``expr`` (one series per node and GPU) restricted to the job's ranks and labelled with
    them."""
    return f"{expr} * on(node, gpu) group_left(job_id, rank) {RANKS}"


def build() -> Dashboard:
    g = Grid()
    g.row("Per rank")
    g.add(timeseries("GPU utilisation", [(by_rank("DCGM_FI_DEV_GPU_UTIL"), LEGEND)],
                     unit="percent"))
    g.add(timeseries("Framebuffer used", [(by_rank("DCGM_FI_DEV_FB_USED"), LEGEND)],
                     unit="decmbytes"))
    g.add(timeseries("Power draw", [(by_rank("DCGM_FI_DEV_POWER_USAGE"), LEGEND)],
                     unit="watt"))
    g.add(timeseries("GPU temperature", [(by_rank("DCGM_FI_DEV_GPU_TEMP"), LEGEND)],
                     unit="celsius"))
    g.row("Errors and links")
    g.add(table("Last XID per GPU (0 = none)",
                [(by_rank("DCGM_FI_DEV_XID_ERRORS"), LEGEND)],
                description="DCGM_FI_DEV_XID_ERRORS: the value of the last XID the GPU raised."))
    g.add(timeseries("PCIe replays/s",
                     [(by_rank(f"rate(DCGM_FI_DEV_PCIE_REPLAY_COUNTER[{RATE}])"), LEGEND)],
                     unit="ops"))
    g.add(timeseries("PCIe throughput", [
        (by_rank("DCGM_FI_PROF_PCIE_TX_BYTES"), "tx " + LEGEND),
        (by_rank("DCGM_FI_PROF_PCIE_RX_BYTES"), "rx " + LEGEND)], unit="Bps"))
    g.add(timeseries("NVLink bandwidth counters/s",
                     [(by_rank(f"rate(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL[{RATE}])"), LEGEND)],
                     unit="ops"))
    g.row("Fleet")
    g.add(timeseries("GPUs reporting per node",
                     [("count by (node) (DCGM_FI_DEV_GPU_TEMP)", "{{node}}")]))
    g.add(table("Hottest GPUs", [("topk(10, DCGM_FI_DEV_GPU_TEMP)", "{{node}} gpu {{gpu}}")],
                unit="celsius"))
    return dashboard("tg-gpu", "trainguard / GPUs",
                     "dcgm-exporter's GPU series joined to the job's ranks.", g.panels,
                     variables=job_variables(),
                     annotations=[incident_annotation('job_id="$job"')])
