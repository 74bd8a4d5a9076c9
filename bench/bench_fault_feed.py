"""An external fault feed of hundreds of nodes, the way a user tries it: imported
(`trainguard import faults`) and replayed (`trainguard replay --log`).

    .venv/bin/python -m bench.bench_fault_feed

Prints figures; nothing is asserted. The feed is generated (seeded): 300 nodes, 1-3 faults
each of 4 classes, overlapping within a node, ~5% still going at the end of the log. Every
(node, class) whose faults all ended must open one `external_fault` verdict and resolve it,
the others stay open; each incident recovers unless a fault under it is still going.
"""

from __future__ import annotations

import random
import time
from collections import Counter

from trainguard.events.payloads import IncidentTransition, Verdict, VerdictState
from trainguard.offline.imports import fault_events
from trainguard.replay import replay_log
from trainguard.rules import load_default_rules

T0_S = 1_796_119_200  # 2026-12-01T10:00:00Z


def feed(nodes: int = 300, seed: int = 7) -> tuple[str, int]:
    rng = random.Random(seed)
    rows = ["node,start,end,fault_class"]
    going: set[tuple[str, str]] = set()
    for i in range(nodes):
        a = T0_S + rng.randint(0, 86_400)
        for _ in range(rng.randint(1, 3)):
            s = a + rng.randint(0, 7200)
            cls = rng.choice(["gpu", "network", "power", "maintenance"])
            open_ended = rng.random() < 0.05
            if open_ended:
                going.add((f"node-{i:03d}", cls))
            rows.append(f"node-{i:03d},{s},{'' if open_ended else s + rng.randint(60, 7200)},"
                        f"{cls}")
    return "\n".join(rows) + "\n", len(going)


def main() -> None:
    text, going = feed()
    t = time.perf_counter()
    events = fault_events(text, name="feed.csv", fmt="csv").events
    t_import = time.perf_counter() - t
    t = time.perf_counter()
    result = replay_log(events, load_default_rules())
    t_replay = time.perf_counter() - t
    verdicts = [e.payload for e in result.replayed_verdicts if isinstance(e.payload, Verdict)]
    states = Counter(v.state for v in verdicts)
    opened = {v.verdict_id for v in verdicts if v.state is VerdictState.OPEN}
    resolved = {v.verdict_id for v in verdicts if v.state is VerdictState.RESOLVED}
    final: dict[str, str] = {}
    for e in result.replayed_transitions:
        if isinstance(e.payload, IncidentTransition):
            final[e.payload.incident_id] = e.payload.to_state.value
    print(f"feed: {text.count(chr(10)) - 1} rows, {len(events)} events, "
          f"{going} (node, class) still going at the end")
    print(f"import: {t_import:.3f}s ({len(events) / t_import:,.0f} events/s); "
          f"replay: {t_replay:.3f}s; mode {result.mode}, exit {result.exit_code}")
    print(f"external_fault verdicts: {states[VerdictState.OPEN]} opened, "
          f"{states[VerdictState.RESOLVED]} resolved, {len(opened - resolved)} still open, "
          f"{len(resolved - opened)} resolved without an open")
    print(f"incidents: {len(final)}, final states {dict(sorted(Counter(final.values()).items()))}")


if __name__ == "__main__":
    main()
