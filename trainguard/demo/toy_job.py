"""A small data-parallel job for the demo: each rank fits a linear model by SGD on its own
shard of a seeded synthetic data set, reporting every step through the trainer-side hook.

Ranks compute for real (pure Python arithmetic, no sleeps) but do not all-reduce: this is the
stage-one workload; the PyTorch DDP reference workload replaces it with the actuators issue.

    python -m trainguard.demo.toy_job --job-id J --rank R --world-size W [--steps N]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import time

from trainguard.sdk import StepReporter

FEATURES = 24
BATCH = 256


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job-id", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--socket", default=os.environ.get("TRAINGUARD_AGENT_SOCKET"))
    args = ap.parse_args()

    truth = random.Random(0)
    w_true = [truth.uniform(-1, 1) for _ in range(FEATURES)]
    rng = random.Random(1000 + args.rank)  # this rank's shard
    w = [0.0] * FEATURES
    lr = 0.05
    kwargs = {"socket_path": args.socket} if args.socket else {}
    with StepReporter(args.job_id, args.rank, args.world_size, dp_rank=args.rank, pp_stage=0,
                      tp_rank=0, **kwargs) as reporter:
        for step in range(args.steps):
            t0 = time.perf_counter()
            grad = [0.0] * FEATURES
            loss = 0.0
            for _ in range(BATCH):
                x = [rng.gauss(0, 1) for _ in range(FEATURES)]
                y = sum(a * b for a, b in zip(w_true, x, strict=True)) + rng.gauss(0, 0.1)
                err = sum(a * b for a, b in zip(w, x, strict=True)) - y
                loss += err * err
                for i in range(FEATURES):
                    grad[i] += 2 * err * x[i]
            w = [wi - lr * g / BATCH for wi, g in zip(w, grad, strict=True)]
            compute_ms = (time.perf_counter() - t0) * 1000
            reporter.step(step=step, samples_consumed=(step + 1) * BATCH,
                          compute_ms=compute_ms, step_ms=compute_ms,
                          loss=loss / BATCH if math.isfinite(loss) else float("nan"),
                          shard_offset=(step + 1) * BATCH)


if __name__ == "__main__":
    main()
