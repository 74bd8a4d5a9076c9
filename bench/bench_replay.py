"""Incidents and replay: the fold's rate, a whole replay's rate, a timeline's cost.

    .venv/bin/python -m bench.bench_replay

Prints figures; nothing is asserted. The log is the synthetic kill -> migrate -> resume of
``trainguard/incidents/synth.py`` scaled up (more ranks, more steps): step reports dominate it,
as in a real log. The live fold is also timed with every record but the step reports arriving
a minute late (as after a broker outage): each 500-record batch that brought one is folded
again from the kept history.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from trainguard.events.envelope import Event
from trainguard.incidents import IncidentSettings, LiveIncidents, rebuild, rebuild_incidents
from trainguard.incidents.synth import Scenario, incident_log
from trainguard.replay import replay_log
from trainguard.rules import load_default_rules
from trainguard.rules.synth import job_steps
from trainguard.timeline import build_timeline, render

T = TypeVar("T")


def timed(fn: Callable[[], T], repeat: int = 3) -> tuple[float, T]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    assert out is not None
    return best, out


def main() -> None:
    sc = Scenario(ranks=32, kill_after_step=400, checkpoint_every=100, resume_steps=100,
                  slow_rank=5, kill_rank=17)
    log = incident_log(sc)
    log = log + rebuild(log)
    rules = load_default_rules()
    n = len(log)
    print(f"log: {n} events ({sc.ranks} ranks, {sc.kill_after_step + sc.resume_steps} steps)")
    s, transitions = timed(lambda: rebuild(log))
    print(f"incident fold (sort + dedupe + fold): {n / s:,.0f} events/s ({s * 1000:.0f} ms, "
          f"{len(transitions)} transitions)")
    s, result = timed(lambda: replay_log(log, rules), repeat=1)
    print(f"replay (rules + fold + compare): {n / s:,.0f} events/s ({s:.2f} s), "
          f"exact={result.exact}")
    settings = IncidentSettings(lateness_us=5_000_000)
    inputs = [e for e in log if e.type != "incident.transition"]
    in_order = sorted(inputs, key=lambda e: e.event_time)
    behind = sorted(inputs, key=lambda e: e.event_time + (0 if e.type == "step.report"
                                                         else 60_000_000))
    s_order, _ = timed(lambda: live_fold(in_order, settings))
    s_late, late = timed(lambda: live_fold(behind, settings))
    print(f"live fold, {len(inputs)} inputs in order: {len(inputs) / s_order:,.0f} events/s; "
          f"every non-step record 60 s late (a broker outage), catch-up per 500-record batch: "
          f"{len(inputs) / s_late:,.0f} events/s ({late} records folded in late), "
          f"ratio {s_order / s_late:.2f}")
    kept, s_one = one_catch_up(settings)
    print(f"one catch-up over {kept:,} kept records (64 ranks x 3,000 steps): "
          f"{s_one * 1000:.0f} ms")
    incs = list(rebuild_incidents(log)[sc.job].incidents.values())
    s, page = timed(lambda: render(build_timeline(incs[-1], log), "html"))
    print(f"timeline of the kill (build + html): {s * 1000:.0f} ms, {len(page) / 1024:.0f} KiB")


def live_fold(events: list[Event], settings: IncidentSettings) -> int:
    """The service's loop without the bus: feed, catch up after each 500-record batch."""
    live = LiveIncidents(settings)
    for i, ev in enumerate(events):
        live.feed(ev)
        if i % 500 == 499:
            live.catch_up()
    live.flush()
    return live.refolded


def one_catch_up(settings: IncidentSettings) -> tuple[int, float]:
    """A job's kill log, then 3,000 steps of 64 ranks; three of its verdicts arrive last."""
    log = incident_log()
    late = [e for e in log if e.type == "verdict"][:3]
    after = max(e.event_time for e in log) + 1_000_000
    live = LiveIncidents(settings)
    kept = 0
    for ev in [e for e in log if e not in late] + list(
            job_steps(log[0].job_id, 64, 3000, start_us=after)):
        live.feed(ev)
        kept += 1
    for ev in late:
        live.feed(ev)
    t0 = time.perf_counter()
    live.catch_up()
    return kept, time.perf_counter() - t0


if __name__ == "__main__":
    main()
