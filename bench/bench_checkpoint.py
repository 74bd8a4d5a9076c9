"""Checkpoint write throughput against a raw fsync'd sequential write of the same bytes.

    .venv/bin/python -m bench.bench_checkpoint [--mib 64] [--runs 7] [--dir DIR]

"ours" is a whole ``CheckpointManager.save`` of a model and its AdamW state (torch.save
streamed through the SHA-256 hasher into a temp file, fsync, rename, the rank file, the
directory fsyncs, the manifest written and fsync'd; the keep-K prune runs on a background
thread, and a save first waits for the previous one's); "raw" writes the very
bytes that save produced (every file of the checkpoint, concatenated) to one file with
``os.write`` in 8 MiB chunks and one fsync. Runs alternate (ours, raw, ours, ...) so a load
change on a shared machine hits both; figures are medians. The ratio is raw time / ours time
(throughput ours / raw). Target: >= 0.8.

The directory defaults to ``~/.cache/trainguard/bench-checkpoint`` (a durable file system:
the point is the fsync); give ``--dir`` to measure another one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from pathlib import Path

import torch
from trainguard_sdk.checkpoint import manifest as mf
from trainguard_sdk.checkpoint.manager import CheckpointConfig, CheckpointManager

CHUNK = 8 << 20


def _model(mib: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A stack of 1024x1024 linears with ``mib`` MiB of float32 weights; one AdamW step so
    its state (two moments) is there: the checkpoint is about 3x ``mib``."""
    layers = max(1, mib // 4)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024, bias=False)
                                  for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 1024)).sum().backward()
    opt.step()
    return model, opt


def _raw_write(path: Path, data: bytes) -> float:
    view = memoryview(data)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        off = 0
        while off < len(view):
            off += os.write(fd, view[off:off + CHUNK])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--mib", type=int, default=64, help="model weights in MiB (x3 on disk)")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--dir", type=Path,
                    default=Path.home() / ".cache" / "trainguard" / "bench-checkpoint")
    args = ap.parse_args()
    root = args.dir
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    torch.manual_seed(0)
    model, opt = _model(args.mib)
    mgr = CheckpointManager(CheckpointConfig(root / "ckpt", keep=2, request_signal=None),
                            job_id="bench")
    raw_path = root / "raw.bin"
    ours: list[float] = []
    raw: list[float] = []
    size = 0
    try:
        for run in range(args.runs + 1):  # run 0 warms up both paths
            t0 = time.perf_counter()
            valid = mgr.save(run + 1, run + 1, model, opt)
            took = time.perf_counter() - t0
            assert valid is not None
            names = [*sorted(valid.manifest.files), mf.MANIFEST_NAME]
            data = b"".join((valid.path / n).read_bytes() for n in names)
            size = len(data)
            raw_s = _raw_write(raw_path, data)
            raw_path.unlink()
            del data
            if run:
                ours.append(took)
                raw.append(raw_s)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mib = size / (1 << 20)
    o, r = statistics.median(ours), statistics.median(raw)
    print(f"checkpoint: {mib:.1f} MiB ({args.mib} MiB of weights + AdamW state), "
          f"{args.runs} runs, medians")
    print(f"  ours (CheckpointManager.save): {o * 1000:8.1f} ms  {mib / o:8.1f} MiB/s  "
          f"(min {min(ours) * 1000:.1f}, max {max(ours) * 1000:.1f})")
    print(f"  raw  (write + fsync)         : {r * 1000:8.1f} ms  {mib / r:8.1f} MiB/s  "
          f"(min {min(raw) * 1000:.1f}, max {max(raw) * 1000:.1f})")
    print(f"  ratio ours/raw throughput: {r / o:.2f}x (target >= 0.8x)")


if __name__ == "__main__":
    main()
