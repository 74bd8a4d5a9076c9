"""A small synchronous data-parallel job for the demo and the tests: each rank computes the
gradient of a linear model on its own shard of a seeded synthetic data set, the ranks average
their gradients every step (rank 0 gathers and broadcasts over local TCP, like a parameter
server), and every step is reported through the trainer-side hook.

Compute is real (pure Python arithmetic, no sleeps) and the exchange is a real barrier, so a
slowed rank makes every peer wait, as in DDP; a dead rank ends the job (survivors exit 3).
The PyTorch DDP reference workload (gloo/NCCL) comes with the actuators issue.

    python -m trainguard.demo.toy_job --job-id J --rank R --world-size W --coord PORT
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from multiprocessing.connection import Client, Connection, Listener

from trainguard_sdk import StepReporter

FEATURES = 24
BATCH = 1024


class Exchange:
    """Gradient averaging across ranks: rank 0 gathers, averages and sends back."""

    def __init__(self, rank: int, world: int, port: int) -> None:
        self.rank = rank
        self.world = world
        self.peers: list[Connection] = []
        self.up: Connection | None = None
        if world == 1:
            return
        if rank == 0:
            with Listener(("127.0.0.1", port), authkey=b"toy-job") as listener:
                self.peers = [listener.accept() for _ in range(world - 1)]
        else:
            deadline = time.monotonic() + 30
            while True:
                try:
                    self.up = Client(("127.0.0.1", port), authkey=b"toy-job")
                    break
                except ConnectionRefusedError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

    def average(self, grad: list[float]) -> list[float]:
        if self.up is not None:
            self.up.send(grad)
            avg: list[float] = self.up.recv()
            return avg
        total = list(grad)
        for conn in self.peers:
            for i, g in enumerate(conn.recv()):
                total[i] += g
        avg = [g / self.world for g in total]
        for conn in self.peers:
            conn.send(avg)
        return avg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job-id", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--socket", default=os.environ.get("TRAINGUARD_AGENT_SOCKET"))
    ap.add_argument("--coord", type=int, default=0, help="rank 0's local TCP port")
    args = ap.parse_args()
    try:
        exchange = Exchange(args.rank, args.world_size, args.coord)
    except OSError as exc:
        print(f"rank {args.rank}: cannot join the job: {exc}", file=sys.stderr)
        sys.exit(3)

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
            compute_ms = (time.perf_counter() - t0) * 1000
            t1 = time.perf_counter()
            try:
                grad = exchange.average(grad)
            except (EOFError, OSError):
                print(f"rank {args.rank}: a peer left the job at step {step}", file=sys.stderr)
                sys.exit(3)
            comm_ms = (time.perf_counter() - t1) * 1000
            w = [wi - lr * g / BATCH for wi, g in zip(w, grad, strict=True)]
            reporter.step(step=step, samples_consumed=(step + 1) * BATCH,
                          compute_ms=compute_ms, comm_ms=comm_ms,
                          step_ms=(time.perf_counter() - t0) * 1000,
                          loss=loss / BATCH if math.isfinite(loss) else float("nan"),
                          shard_offset=(step + 1) * BATCH)


if __name__ == "__main__":
    main()
