"""One job: per-rank step time (heatmap), straggler ratio, progress and checkpoints."""

from __future__ import annotations

from grafanalib.core import Dashboard

from trainguard.dashboards.common import dashboard, incident_annotation, job_variables
from trainguard.dashboards.panels import Grid, heatmap, stat, timeseries

JOB = 'job_id="$job"'
RANK = f'{JOB}, rank=~"$rank"'


def build() -> Dashboard:
    g = Grid()
    g.add(stat("Latest step", f"trainguard_job_last_step{{{JOB}}}"), w=6, h=4)
    g.add(stat("Last valid checkpoint step",
               f'max(trainguard_checkpoint_last_step{{{JOB}, action=~"written|verified"}})'),
          w=6, h=4)
    g.add(stat("Checkpoint age",
               f'time() - max(trainguard_checkpoint_last_timestamp_seconds{{{JOB}, '
               f'action=~"written|verified"}})', unit="s"), w=6, h=4)
    g.add(stat("Ranks reporting", f"count(trainguard_step_compute_seconds{{{JOB}}})"), w=6, h=4)
    g.add(heatmap("Step compute time per rank", f"trainguard_step_compute_seconds{{{RANK}}}",
                  "{{rank}}", unit="s",
                  description="One row per rank, colour = latest compute time."), w=24, h=10)
    g.add(timeseries("Straggler ratio (rank / peer median)",
                     [(f"trainguard_straggler_ratio{{{RANK}}}", "rank {{rank}}")],
                     description="Evidence of the open straggler verdicts; gone when resolved."))
    g.add(timeseries("Step compute time", [(f"trainguard_step_compute_seconds{{{RANK}}}",
                                            "rank {{rank}}")], unit="s"))
    return dashboard("tg-job", "trainguard / Job", "One job's ranks, stragglers and progress.",
                     g.panels, variables=job_variables(),
                     annotations=[incident_annotation(JOB)])
