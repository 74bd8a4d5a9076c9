"""A small DDP job (gloo, CPU) with DDP's overlap on, one rank optionally throttled in its
forward pass: what the SDK's compute timing (``trainguard_sdk.ddp.StepTimer``) is tested and
benchmarked on.

    python -m trainguard.workload.overlap --rank R --world-size W --port P --steps N \\
        [--sdk] [--job-id J] [--slow-rank R --slow-from S --slow-ms MS] [--out F]

``--rank all`` imports torch once and forks every rank (the exit code is the worst rank's;
``--out`` then names one file per rank: ``F.<rank>``).

``--sdk``: the timer's communication hook and a ``StepReporter`` (to
``$TRAINGUARD_AGENT_SOCKET``) are on; without it, plain DDP. ``--out``: a JSONL line per step
(``compute_ms``, ``comm_ms``, ``step_ms``, ``buckets``, ``spread_ms`` with ``--sdk``; always
``naive_ms``: step start -> backward returned, what a timer around the overlapped backward
sees), then a last line ``{"kind": "done", "loop_s": ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from trainguard_sdk.wire import Section


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m trainguard.workload.overlap")
    ap.add_argument("--rank", required=True, help="a rank, or 'all': fork every rank here")
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--sdk", action="store_true")
    ap.add_argument("--job-id", default="overlap")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bucket-mb", type=float, default=0.25, help="DDP bucket_cap_mb")
    ap.add_argument("--slow-rank", type=int, default=-1)
    ap.add_argument("--slow-from", type=int, default=0, help="first throttled step")
    ap.add_argument("--slow-ms", type=float, default=0.0, help="sleep in the forward pass")
    ap.add_argument("--out", type=Path, default=None)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.rank == "all":
        return _fork_all(args)
    args.rank = int(args.rank)
    return _run(args)


def _fork_all(args: argparse.Namespace) -> int:
    import importlib

    for name in ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo"):
        importlib.import_module(name)  # once, before the fork
    pids = []
    for rank in range(args.world_size):
        pid = os.fork()
        if pid == 0:
            args.rank = rank
            if args.out is not None:
                args.out = Path(f"{args.out}.{rank}")
            code = 1
            try:
                code = _run(args)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        pids.append(pid)
    worst = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        worst = max(worst, os.waitstatus_to_exitcode(status) if status else 0, 0)
        if status and os.waitstatus_to_exitcode(status) < 0:
            worst = max(worst, 1)
    return worst


def _no_section(_section: Section) -> None:
    """Without the SDK: the same call in the loop, doing nothing."""


def _run(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    store = dist.TCPStore(  # type: ignore[attr-defined]  # public; stubs do not re-export
        "127.0.0.1", args.port, args.world_size, is_master=args.rank == 0,
        timeout=timedelta(seconds=120), wait_for_workers=True)
    dist.init_process_group("gloo", store=store, rank=args.rank, world_size=args.world_size,
                            timeout=timedelta(seconds=60))
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(32, args.hidden), nn.ReLU()]
    for _ in range(args.layers - 1):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.hidden, 4))
    step_box = [0]

    def throttle(_m: nn.Module, _inp: Any) -> None:
        if args.rank == args.slow_rank and step_box[0] >= args.slow_from:
            time.sleep(args.slow_ms / 1000)

    model.register_forward_pre_hook(throttle)
    ddp = DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    timer = reporter = None
    section: Callable[[Section], None] = _no_section
    if args.sdk:
        from trainguard_sdk import StepReporter
        from trainguard_sdk.ddp import StepTimer

        reporter = StepReporter(args.job_id, args.rank, args.world_size, dp_rank=args.rank)
        timer = StepTimer(ddp, reporter=reporter)  # enters "comm" at the last bucket
        section = reporter.section
    g = torch.Generator().manual_seed(args.rank)
    x = torch.randn(args.batch, 32, generator=g)
    y = torch.randint(0, 4, (args.batch,), generator=g)
    loss_fn = nn.CrossEntropyLoss()
    out = open(args.out, "w", encoding="utf-8") if args.out else None  # noqa: SIM115
    dist.barrier()
    t_loop = time.perf_counter()
    for step in range(1, args.steps + 1):
        step_box[0] = step
        t0 = time.perf_counter()
        if timer is not None:
            timer.start()
        opt.zero_grad(set_to_none=True)
        section(Section.FORWARD)
        loss = loss_fn(ddp(x), y)
        section(Section.BACKWARD)
        loss.backward()
        t1 = time.perf_counter()
        section(Section.OPTIMIZER)
        opt.step()
        line: dict[str, Any] = {"step": step, "naive_ms": (t1 - t0) * 1000}
        if timer is not None and reporter is not None:
            t = timer.stop()
            if t is not None:
                reporter.step(step, step * args.batch * args.world_size, t.compute_ms,
                              comm_ms=t.comm_ms, step_ms=t.step_ms)
                line.update(compute_ms=t.compute_ms, comm_ms=t.comm_ms, step_ms=t.step_ms,
                            buckets=t.buckets, spread_ms=t.bucket_spread_ms)
        line["wall_ms"] = (time.perf_counter() - t0) * 1000  # the whole step, either variant
        if out is not None:
            out.write(json.dumps(line) + "\n")
    loop_s = time.perf_counter() - t_loop
    dist.barrier()
    if out is not None:
        out.write(json.dumps({"kind": "done", "loop_s": loop_s}) + "\n")
        out.close()
    if reporter is not None:
        reporter.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip the interpreter's slow teardown of torch's compiler stack
