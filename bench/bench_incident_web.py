"""The served timeline pages: what a request costs the fold's loop, and what the worker
thread then spends building and rendering the page.

    .venv/bin/python -m bench.bench_incident_web

Prints figures; nothing is asserted. The log is the synthetic kill -> migrate -> resume of
``trainguard/incidents/synth.py`` scaled up (32 ranks, 600 steps before the kill: about 20k
events kept for the job), fed to the live fold and the kept context as the service feeds them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from trainguard.incidents import LiveIncidents
from trainguard.incidents.context import EventContext
from trainguard.incidents.synth import Scenario, incident_log
from trainguard.incidents.web import Page, incident_path, render_timeline, resolve
from trainguard.incidents.webserver import LiveSource


def main(repeat: int = 5) -> None:
    log = incident_log(Scenario(ranks=32, kill_after_step=600, checkpoint_every=200))
    live, context = LiveIncidents(), EventContext()
    for ev in log:
        context.add(ev)
        live.feed(ev)
    live.flush()
    source = LiveSource(live, context)
    print(f"{len(log)} events, {len(source.incidents())} incidents")
    best = min(_time(lambda: resolve("GET", "/", source)) for _ in range(repeat))
    print(f"/ (the list, in the loop): {best * 1e3:.1f} ms")
    for inc in source.incidents():
        path = incident_path(inc.incident_id)
        loop_s, thread_s = [], []
        kept = size = 0
        for _ in range(repeat):
            t0 = time.perf_counter()
            req = resolve("GET", path, source)
            t1 = time.perf_counter()
            assert not isinstance(req, Page)
            page = render_timeline(req)
            kept, size = len(req.events), len(page.body)
            loop_s.append(t1 - t0)
            thread_s.append(time.perf_counter() - t1)
        print(f"{path[:22]}… {kept} events, {size // 1024} KiB: in the "
              f"loop {min(loop_s) * 1e3:.1f} ms (best of {repeat}), in the thread "
              f"{min(thread_s) * 1e3:.0f} ms")


def _time(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
