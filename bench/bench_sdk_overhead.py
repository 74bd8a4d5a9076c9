"""What the trainer SDK costs a DDP job: the same small DDP job (4 gloo ranks on this machine,
``trainguard.workload.overlap``, overlap on) with and without the SDK (``StepTimer``'s
communication hook, a ``StepReporter`` with its heartbeat thread, one report per step), runs
interleaved in one session; and the cost of one ``StepReporter.step()`` call.

    .venv/bin/python -m bench.bench_sdk_overhead [--rounds 3] [--steps 300]

Prints per round the loop time of each variant (the slowest rank's, from the first step to
the last), the spread of bucket-ready times within a step (first bucket ready -> last: the
exchange starts while backward still runs, so the overlap is kept), the per-call cost of
``step()`` (median over batches of 8 to a drained socket; also with the four ``section()``
calls of a step), and last ``ratio with/without: X``: the median over rounds of each round's
paired ratio of median step times (the slowest rank's median ``wall_ms``, steps after the
fifth). Median step times and paired rounds because the 2-core dev machine is shared: a burst
of load lands on whole seconds of one run, which moves its loop time (also printed, with the
per-round loop ratios) far more than its median step; the min/max over rounds is the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainguard_sdk import Section, StepReporter, wire

from trainguard.dev.kafka import free_port

WORLD = 4


def run_job(tmp: Path, sdk: bool, steps: int) -> tuple[float, float, list[float]]:
    """(the slowest rank's loop seconds, the slowest rank's median step ms, every step's
    bucket spread in ms) of one run."""
    out = tmp / ("with" if sdk else "without")
    argv = [sys.executable, "-m", "trainguard.workload.overlap", "--rank", "all",
            "--world-size", str(WORLD), "--port", str(free_port()), "--steps", str(steps),
            "--out", str(out), *(["--sdk"] if sdk else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "TRAINGUARD_AGENT_SOCKET": str(tmp / "agent.sock")}
    subprocess.run(argv, env=env, check=True, timeout=600)
    loops, medians, spreads = [], [], []
    for r in range(WORLD):
        rows = [json.loads(x) for x in Path(f"{out}.{r}").read_text().splitlines()]
        loops.append(rows[-1]["loop_s"])
        medians.append(statistics.median(x["wall_ms"] for x in rows if x.get("step", 0) > 5))
        spreads += [x["spread_ms"] for x in rows if x.get("step", 0) > 1 and "spread_ms" in x]
    return max(loops), max(medians), spreads


def step_cost_us(tmp: Path, batches: int = 20_000, batch: int = 8,
                 sections: bool = False) -> float:
    """Median µs per ``step()`` call to a listening socket drained between batches; with
    ``sections``, each report also comes with the four ``section()`` calls of a step."""
    path = str(tmp / f"cost-{int(sections)}.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.setblocking(False)
    tg = StepReporter("job-bench", 3, 8, dp_rank=3, socket_path=path, heartbeat_interval_s=None)
    clock = time.perf_counter_ns
    per: list[float] = []
    i = 0
    try:
        for _ in range(batches):
            t0 = clock()
            for _ in range(batch):
                if sections:
                    tg.section(Section.DATA)
                    tg.section(Section.FORWARD)
                    tg.section(Section.BACKWARD)
                    tg.section(Section.OPTIMIZER)
                tg.step(i, i * 32, 181.5, comm_ms=20.25, data_wait_ms=1.5, step_ms=204.0,
                        loss=2.31)
                i += 1
            per.append((clock() - t0) / batch / 1000)
            while True:
                try:
                    rx.recv(wire.MAX_DATAGRAM)
                except BlockingIOError:
                    break
    finally:
        tg.close()
        rx.close()
    return float(statistics.median(per))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_sdk_overhead")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tgbo", dir="/tmp") as d:
        tmp = Path(d)
        rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # the agent's socket: a sink
        rx.bind(str(tmp / "agent.sock"))
        with_s: list[float] = []
        without_s: list[float] = []
        step_ratios: list[float] = []
        spreads: list[float] = []
        try:
            for n in range(args.rounds):
                # interleaved, the order alternating: a round's pair shares the machine's load
                order = (False, True) if n % 2 == 0 else (True, False)
                med: dict[bool, float] = {}
                for sdk in order:
                    loop, med[sdk], spread = run_job(tmp, sdk, args.steps)
                    (with_s if sdk else without_s).append(loop)
                    spreads += spread
                    print(f"round {n + 1}: {'with' if sdk else 'without'} the SDK: "
                          f"{loop:.3f} s for {args.steps} steps, median step "
                          f"{med[sdk]:.3f} ms", flush=True)
                    while True:  # keep the sink's queue empty between runs
                        try:
                            rx.recv(wire.MAX_DATAGRAM, socket.MSG_DONTWAIT)
                        except BlockingIOError:
                            break
                step_ratios.append(med[True] / med[False])
                print(f"round {n + 1}: median-step ratio with/without {step_ratios[-1]:.3f}",
                      flush=True)
        finally:
            rx.close()
        spreads.sort()
        print(f"bucket-ready spread within a step (ms): median {statistics.median(spreads):.2f}"
              f", p10 {spreads[len(spreads) // 10]:.2f}, p90 {spreads[len(spreads) * 9 // 10]:.2f}"
              " (> 0: the exchange of early buckets overlaps the rest of backward)")
        print(f"StepReporter.step(): median {step_cost_us(tmp):.2f} µs per report; with the "
              f"4 section() calls of a step: {step_cost_us(tmp, sections=True):.2f} µs")
    loop_ratio = statistics.median(with_s) / statistics.median(without_s)
    step_ratios.sort()
    print(f"loop-time ratio (median with / median without): {loop_ratio:.3f}; per-round loop "
          "ratios " + ", ".join(f"{w / o:.3f}" for w, o in zip(with_s, without_s, strict=True)))
    print(f"median-step ratios per round: min {step_ratios[0]:.3f}, median "
          f"{statistics.median(step_ratios):.3f}, max {step_ratios[-1]:.3f} "
          f"({len(step_ratios)} rounds)")
    print(f"ratio with/without: {statistics.median(step_ratios):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
