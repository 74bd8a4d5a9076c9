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

Async sharded saves (``layout="dcp"``, ``async_save``), same model state, same run, in turns
with the others: the training thread's stall per save (``save()`` until it returns: the state
dict, the staging copy into reused buffers, the start of the background write) against a
synchronous save of the same state: the same DCP save with ``async_save=False`` (same bytes,
same checksum, same fsyncs; the training thread is stalled for all of it) and, printed too,
the ``state.pt`` save above. Target: stall ratio async/sync <= 0.10. And the background
part's throughput: the checkpoint's bytes over the time from ``save()`` returning to the
manifest committed (the ``written`` record's ``write_ms`` less the stall: DCP's write, the
checksum as it writes, the fsyncs, the progress files, the manifest; not the keep-K prune
that follows on the same thread), with ``wait()`` called at once, against a raw write +
fsync of the same bytes. Target: >= 0.8. Nothing else of the bench runs meanwhile (the
``state.pt`` manager's background prune is waited for first).

And with ``stage_in_background`` (the staging copy overlaps the next step's forward and
backward; that step's ``optimizer.step()`` waits for it): the stall is ``save()`` (the buffers'
clone) plus that wait, measured around one real training step (``--batch`` rows through the
model, forward, backward, AdamW step) right after the save, against the same sync dcp save.
The step's own time is printed too: the overlap window is its forward and backward.

The directory defaults to ``~/.cache/trainguard/bench-checkpoint`` (a durable file system:
the point is the fsync); give ``--dir`` to measure another one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from trainguard_sdk.checkpoint import manifest as mf
from trainguard_sdk.checkpoint.manager import CheckpointConfig, CheckpointManager
from trainguard_sdk.checkpoint.store import Valid

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


def _train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()


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


def _raw_of(valid: Valid, raw_path: Path) -> tuple[int, float]:
    """(bytes, seconds) of a raw write + fsync of every file of the checkpoint."""
    names = [*sorted(valid.manifest.files), mf.MANIFEST_NAME]
    data = b"".join((valid.path / n).read_bytes() for n in names)
    took = _raw_write(raw_path, data)
    raw_path.unlink()
    return len(data), took


class _Written:
    """A checkpoint sink keeping the ``written`` records' ``write_ms`` (save() to commit)."""

    def __init__(self) -> None:
        self.write_ms: list[float] = []

    def checkpoint(self, action: str, step: int, samples_consumed: int, path: str,
                   **kw: Any) -> bool:
        if action == "written" and kw.get("write_ms") is not None:
            self.write_ms.append(kw["write_ms"])
        return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--mib", type=int, default=64, help="model weights in MiB (x3 on disk)")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--checksum", choices=("sha256", "crc32"), default=None,
                    help="the dcp saves' file checksum (default: the layout's, crc32)")
    ap.add_argument("--batch", type=int, default=64,
                    help="rows per training step after a background-staged save")
    ap.add_argument("--dir", type=Path,
                    default=Path.home() / ".cache" / "trainguard" / "bench-checkpoint")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
    load_before = os.getloadavg()
    root = args.dir
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    torch.manual_seed(0)
    model, opt = _model(args.mib)
    mgr = CheckpointManager(CheckpointConfig(root / "ckpt", keep=2, request_signal=None),
                            job_id="bench")
    written = _Written()
    amgr = CheckpointManager(CheckpointConfig(root / "ackpt", keep=2, request_signal=None,
                                              layout=mf.LAYOUT_DCP, checksum=args.checksum),
                             job_id="bench", sink=written)
    smgr = CheckpointManager(CheckpointConfig(root / "sckpt", keep=2, request_signal=None,
                                              layout=mf.LAYOUT_DCP, async_save=False,
                                              checksum=args.checksum), job_id="bench")
    bmgr = CheckpointManager(CheckpointConfig(root / "bckpt", keep=2, request_signal=None,
                                              layout=mf.LAYOUT_DCP, checksum=args.checksum,
                                              stage_in_background=True), job_id="bench")
    cmgr = CheckpointManager(CheckpointConfig(root / "cckpt", keep=2, request_signal=None,
                                              layout=mf.LAYOUT_DCP, checksum=args.checksum),
                             job_id="bench")
    batch = torch.randn(args.batch, 1024)
    raw_path = root / "raw.bin"
    bstalls: list[float] = []
    steps: list[float] = []
    alone: list[float] = []
    asteps: list[float] = []
    ours: list[float] = []
    raw: list[float] = []
    stalls: list[float] = []
    dsync: list[float] = []
    background: list[float] = []
    araw: list[float] = []
    size = asize = 0
    try:
        for run in range(args.runs + 1):  # run 0 warms up every path
            t0 = time.perf_counter()
            valid = mgr.save(run + 1, run + 1, model, opt)
            took = time.perf_counter() - t0
            assert valid is not None
            size, raw_s = _raw_of(valid, raw_path)
            mgr.wait_prune()
            smgr.wait_prune()
            t0 = time.perf_counter()
            assert smgr.save(run + 1, run + 1, model, opt) is not None
            dsync_s = time.perf_counter() - t0
            smgr.wait_prune()
            t0 = time.perf_counter()
            assert amgr.save(run + 1, run + 1, model, opt) is None
            t1 = time.perf_counter()
            avalid = amgr.wait()
            assert avalid is not None
            commit_s = written.write_ms[-1] / 1000  # save() to the manifest committed
            asize, araw_s = _raw_of(avalid, raw_path)
            b0 = time.perf_counter()
            _train_step(model, opt, batch)  # no save in flight
            alone_s = time.perf_counter() - b0
            assert cmgr.save(run + 1, run + 1, model, opt) is None  # async, staged in save()
            b0 = time.perf_counter()
            _train_step(model, opt, batch)  # the write runs meanwhile
            astep_s = time.perf_counter() - b0
            assert cmgr.wait() is not None
            b0 = time.perf_counter()
            assert bmgr.save(run + 1, run + 1, model, opt) is None
            bsave_s = time.perf_counter() - b0
            _train_step(model, opt, batch)  # waits in step() for the staging copy
            step_s = time.perf_counter() - b0 - bsave_s
            assert bmgr.wait() is not None and bmgr.last_step_wait_ms is not None
            if run:
                bstalls.append(bsave_s + bmgr.last_step_wait_ms / 1000)
                steps.append(step_s)
                alone.append(alone_s)
                asteps.append(astep_s)
                ours.append(took)
                raw.append(raw_s)
                stalls.append(t1 - t0)
                dsync.append(dsync_s)
                background.append(commit_s - (t1 - t0))
                araw.append(araw_s)
    finally:
        amgr.close()
        bmgr.close()
        cmgr.close()
        mgr.close()
        smgr.close()
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
    amib = asize / (1 << 20)
    st, ds, bg, ar = (statistics.median(v) for v in (stalls, dsync, background, araw))
    print(f"async sharded (dcp) save of the same state: {amib:.1f} MiB on disk, "
          f"checksum {amgr.config.file_checksum}")
    print(f"  training-thread stall per save : {st * 1000:8.1f} ms  (min {min(stalls) * 1000:.1f}"
          f", max {max(stalls) * 1000:.1f})")
    print(f"  sync dcp save, same state      : {ds * 1000:8.1f} ms  (min {min(dsync) * 1000:.1f}"
          f", max {max(dsync) * 1000:.1f})")
    print(f"  background write to commit     : {bg * 1000:8.1f} ms  {amib / bg:8.1f} MiB/s")
    print(f"  raw  (write + fsync, same bytes): {ar * 1000:8.1f} ms  {amib / ar:8.1f} MiB/s")
    bs, step, lone, astep = (statistics.median(v) for v in (bstalls, steps, alone, asteps))
    print(f"  background-staged: stall per save {bs * 1000:8.1f} ms (save() + the next step's "
          f"wait; min {min(bstalls) * 1000:.1f}, max {max(bstalls) * 1000:.1f})")
    print(f"  a training step (batch {args.batch}): {lone * 1000:.1f} ms with no save in "
          f"flight; right after an async save {astep * 1000:.1f} ms, after a "
          f"background-staged one {step * 1000:.1f} ms (its wait included): the write (and "
          f"the copy) compete for the cores and the GIL")
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f} "
          f"({os.cpu_count()} CPUs)")
    print(f"stall ratio async/sync state.pt save: {st / o:.3f}")
    print(f"stall ratio async/sync dcp save: {st / ds:.3f} (target <= 0.10)")
    print(f"stall ratio background-staged/sync dcp save: {bs / ds:.3f} (target <= 0.10)")
    print(f"time lost per save, stall + the next step's slowdown, over the sync save: async "
          f"{(st + astep - lone) / ds:.3f}, background-staged {(bs + step - lone) / ds:.3f}")
    print(f"background throughput / raw write+fsync: {ar / bg:.2f} (target >= 0.8)")

if __name__ == "__main__":
    main()
