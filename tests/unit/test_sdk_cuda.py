"""The trainer SDK's CUDA paths on a real GPU (issue 12): StepTimer with CUDA events under NCCL,
read one step late and never waited for; a sharded async checkpoint of a CUDA model (pinned
staging) loaded back exactly, with the CUDA RNG state.

Skipped where torch sees no GPU (this project's CI machine). On a GPU machine, the unit tier
runs them. On a lent GPU machine (the `device` tool: its python3 holds torch and pytest, not
trainguard's dependencies), from the repository's root, the SDK alone:

    PYTHONPATH=sdk python3 -m pytest -q -p no:cacheprovider --noconftest tests/unit/test_sdk_cuda.py

One process, world size 1: NCCL refuses two ranks on one device, and a lent machine has one
GPU."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from trainguard_sdk.checkpoint import manifest as mf
from trainguard_sdk.checkpoint import rng
from trainguard_sdk.checkpoint.collective import TorchCollective
from trainguard_sdk.checkpoint.manager import CheckpointConfig, CheckpointManager
from trainguard_sdk.ddp import StepTimer

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")]
DEVICE = torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
GPU_MS = 20.0  # the GPU time each step's forward spends in a sleep kernel


@pytest.fixture(scope="module")
def nccl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    store = dist.FileStore(str(tmp_path_factory.mktemp("nccl") / "store"), 1)  # type: ignore[attr-defined]
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=DEVICE)
    yield
    dist.destroy_process_group()


def _gpu_sleep(cycles: int) -> None:
    """Keep the GPU busy for ``cycles`` clock cycles (a kernel; the host returns at once)."""
    torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]


def _cycles_per_ms() -> float:
    ev = torch.cuda.Event
    start, end = ev(enable_timing=True), ev(enable_timing=True)  # type: ignore[no-untyped-call]
    start.record()
    _gpu_sleep(20_000_000)
    end.record()
    end.synchronize()
    ms: float = start.elapsed_time(end)
    return 20_000_000 / ms


def _model(sleep_cycles: int = 0) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 2)).to(DEVICE)
    if sleep_cycles:
        m.register_forward_pre_hook(lambda _m, _i: _gpu_sleep(sleep_cycles))
    return m


def test_cuda_figures_on_a_gpu_come_one_step_late_and_stop_never_waits(nccl: None) -> None:
    cpm = _cycles_per_ms()
    ddp = DistributedDataParallel(_model(int(GPU_MS * cpm)), device_ids=[0], bucket_cap_mb=0.01)
    timer = StepTimer(ddp)
    assert timer.cuda  # its parameters are on the GPU
    x = torch.ones(32, 64, device=DEVICE)
    got, stop_s = [], []
    for step in range(6):
        timer.start()
        ddp(x).sum().backward()
        if step == 4:
            _gpu_sleep(int(200 * cpm))  # the GPU is busy for 200 ms more
        t0 = time.perf_counter()
        got.append(timer.stop())
        stop_s.append(time.perf_counter() - t0)
    last = timer.flush()  # the one synchronisation, after the loop
    assert got[0] is None  # step 0 is read at step 1
    assert max(stop_s) < 0.05, stop_s  # never waited for the GPU, not even behind 200 ms
    timings = [t for t in got if t is not None] + ([last] if last is not None else [])
    assert [t.index for t in timings] == sorted({t.index for t in timings})
    assert timings[-1].index == 5
    for t in timings:
        assert t.buckets >= 2
        assert t.compute_ms >= 0.8 * GPU_MS, t  # the sleep in forward is this rank's compute
        assert t.comm_ms >= 0.0 and t.compute_ms + t.comm_ms <= t.step_ms + 0.5
        assert 0.0 <= t.bucket_spread_ms <= t.compute_ms
    # the step after the 200 ms kernel found step 4 still running: skipped, not waited for
    assert timer.skipped >= 1 or any(t.step_ms >= 150.0 for t in timings)


def test_a_cuda_model_saves_async_and_loads_back_exactly_with_its_rng(
        nccl: None, tmp_path: Path) -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    cfg = CheckpointConfig(tmp_path / "ckpt", allow_tmp=True, layout=mf.LAYOUT_DCP,
                           every_steps=2, keep=2)
    mgr = CheckpointManager(cfg, job_id="job-cuda", collective=TorchCollective())
    x = torch.randn(32, 64, device=DEVICE)
    expected: dict[str, torch.Tensor] = {}
    cuda_rng = torch.cuda.get_rng_state()
    for step in range(1, 3):
        opt.zero_grad()
        model(x).sum().backward()
        opt.step()
        if mgr.due(step):
            cuda_rng = torch.cuda.get_rng_state()
            assert mgr.save(step, step * 32, model, opt) is None  # async
            expected = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
            with torch.no_grad():  # training goes on: the save has its own staged copy
                for p in model.parameters():
                    p.add_(1.0)
    assert mgr.wait() is not None
    mgr.close()
    assert "cuda" in rng.capture()

    torch.manual_seed(1234)
    torch.cuda.manual_seed(1234)  # another CUDA RNG state: the load must bring the saved one
    fresh = _model()
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.01)
    restored = CheckpointManager(cfg, job_id="job-cuda",
                                 collective=TorchCollective()).resume(fresh, fresh_opt)
    assert restored is not None and restored.progress.step == 2
    for name, p in fresh.named_parameters():
        assert p.device.type == "cuda"
        assert torch.equal(p.detach().cpu(), expected[name]), name
    assert torch.equal(torch.cuda.get_rng_state(), cuda_rng)
