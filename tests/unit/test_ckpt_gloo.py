"""CheckpointManager in real 2-rank gloo jobs (forked processes, seconds each): a save request
that lands on one rank mid-run is saved by both ranks at the same step with no all-reduce on
any step; sharded async saves through torch.distributed.checkpoint for DDP and FSDP2
(``fully_shard`` on CPU), loaded back exactly, falling back past a corrupt or missing shard."""

from __future__ import annotations

import json
import os
import signal
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.multiprocessing.spawn import start_processes
from torch.nn.parallel import DistributedDataParallel
from trainguard_sdk.checkpoint import checksum
from trainguard_sdk.checkpoint import manifest as mf
from trainguard_sdk.checkpoint.collective import TorchCollective
from trainguard_sdk.checkpoint.manager import CheckpointConfig, CheckpointManager
from trainguard_sdk.checkpoint.schedule import save_at

WORLD = 2
Worker = Callable[..., None]


def _run(worker: Worker, tmp_path: Path, *args: Any, timeout_s: float = 120.0) -> None:
    """``worker(rank, tmp_path, *args)`` on 2 forked ranks joined in a gloo group (the
    default store is a FileStore: save requests travel through it)."""
    store = tmp_path / f"store-{time.monotonic_ns()}"
    ctx = start_processes(_entry,  # type: ignore[no-untyped-call]
                          args=(worker, store, tmp_path, *args), nprocs=WORLD,
                          join=False, start_method="fork")
    deadline = time.monotonic() + timeout_s
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise AssertionError(f"{worker.__name__}: ranks still running after "
                                     f"{timeout_s} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()


def _entry(rank: int, worker: Worker, store: Path, tmp_path: Path, *args: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=WORLD)
    try:
        worker(rank, tmp_path, *args)
    finally:
        dist.destroy_process_group()


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 2))


def _batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step * 100 + rank)
    return torch.randn(8, 8, generator=g), torch.randint(0, 2, (8,), generator=g)


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, step: int, rank: int) -> None:
    x, y = _batch(step, rank)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
    opt.step()


def _manager(root: Path, **kw: Any) -> CheckpointManager:
    cfg = CheckpointConfig(root, allow_tmp=True, request_signal=signal.SIGUSR1, **kw)
    return CheckpointManager(cfg, job_id="job-g", collective=TorchCollective())


def _full(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, whole (an FSDP2 DTensor gathered), by name."""
    out = {}
    for name, p in model.named_parameters():
        t = p.detach()
        full = getattr(t, "full_tensor", None)
        out[name] = (full() if full is not None else t).clone()
    return out


def _optim_full(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = []
    for _, st in sorted(opt.state_dict()["state"].items()):
        for key in ("exp_avg", "exp_avg_sq"):
            t = st[key]
            full = getattr(t, "full_tensor", None)
            out.append((full() if full is not None else t).clone())
    return out


# -- save on command: no collective per step ---------------------------------------------------

REQUEST_AT = 7
POLL = 3
STEPS = 20


def _request_worker(rank: int, tmp_path: Path) -> None:
    def no_all_reduce(*a: Any, **k: Any) -> None:
        raise AssertionError("due() must not all-reduce")

    dist.all_reduce = no_all_reduce  # type: ignore[assignment]
    TorchCollective.any = no_all_reduce  # type: ignore[assignment,method-assign]
    torch.manual_seed(0)
    model = _net()
    ddp = DistributedDataParallel(model)  # its gradient all-reduce: the ranks' lock step
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    mgr = _manager(tmp_path / "ckpt", poll_every=POLL)
    mgr.install_request_signal()
    saved = []
    for step in range(1, STEPS + 1):
        _train_step(ddp, opt, step, rank)
        if rank == 1 and step == REQUEST_AT:
            os.kill(os.getpid(), signal.SIGUSR1)  # one rank only, as the actuator does
        if mgr.due(step):
            saved.append(step)
            mgr.save(step, step * 16, model, opt)
    mgr.close()
    assert mgr.requests is not None
    reads = getattr(mgr.requests, "reads", None)
    (tmp_path / f"saved-{rank}.json").write_text(json.dumps({"saved": saved, "reads": reads}))


def test_a_request_on_one_rank_is_saved_by_both_at_the_same_step_without_all_reduce(
        tmp_path: Path) -> None:
    _run(_request_worker, tmp_path)
    results = [json.loads((tmp_path / f"saved-{r}.json").read_text()) for r in range(WORLD)]
    expected = save_at(REQUEST_AT, POLL)  # 12: a polling step more than POLL steps on
    assert [r["saved"] for r in results] == [[expected], [expected]]
    # the store is read on polling steps only (plus the requester's propose on rank 1)
    assert results[0]["reads"] == STEPS // POLL
    assert results[1]["reads"] <= STEPS // POLL + 2
    committed = [p.name for p in (tmp_path / "ckpt").glob("step-*")
                 if (p / mf.MANIFEST_NAME).exists()]
    assert committed == [f"step-{expected:012d}"]


# -- sharded async saves: DDP ------------------------------------------------------------------


def _ddp_save_worker(rank: int, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _net()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    mgr = _manager(tmp_path / "ckpt", layout=mf.LAYOUT_DCP, every_steps=2, keep=3)
    for step in range(1, 5):
        _train_step(ddp, opt, step, rank)
        if mgr.due(step):
            assert mgr.save(step, step * 16, model, opt, extra={"at": step}) is None  # async
            snapshot = {"params": _full(model), "optim": _optim_full(opt)}
            if rank == 0:
                torch.save(snapshot, tmp_path / f"expected-{step}.pt")
            # training goes on while the save is written: the saved state is the staged one
    valid = mgr.wait()
    assert (valid is not None) == (rank == 0)
    mgr.close()


def _ddp_resume_worker(rank: int, tmp_path: Path, expect_step: int) -> None:
    torch.manual_seed(1000 + rank)  # other weights on each rank: the load must replace them
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    restored = _manager(tmp_path / "ckpt", layout=mf.LAYOUT_DCP).resume(model, opt)
    assert restored is not None and restored.progress.step == expect_step
    assert restored.progress.samples_consumed == expect_step * 16
    assert restored.extra == {"at": expect_step}
    expected = torch.load(tmp_path / f"expected-{expect_step}.pt", weights_only=True)
    got = _full(model)
    assert got.keys() == expected["params"].keys()
    for name, tensor in expected["params"].items():
        assert torch.equal(got[name], tensor), name
    for a, b in zip(_optim_full(opt), expected["optim"], strict=True):
        assert torch.equal(a, b)
    (tmp_path / f"resumed-{rank}.json").write_text(json.dumps(restored.skipped))


def _committed(root: Path) -> dict[int, mf.Manifest]:
    out = {}
    for p in sorted(root.glob("step-*")):
        raw = p / mf.MANIFEST_NAME
        if raw.exists():
            out[int(p.name.split("-")[1])] = mf.decode(raw.read_bytes())
    return out


@pytest.mark.parametrize("damage", ["bitflip", "missing"])
def test_ddp_async_sharded_save_loads_exactly_and_falls_back_past_a_bad_shard(
        tmp_path: Path, damage: str) -> None:
    _run(_ddp_save_worker, tmp_path)
    committed = _committed(tmp_path / "ckpt")
    assert sorted(committed) == [2, 4]
    m = committed[4]
    assert m.layout == mf.LAYOUT_DCP and m.format == mf.FORMAT_CHECKSUMS
    assert {e.algorithm for e in m.files.values()} == {checksum.CRC32}  # the dcp default
    shards = sorted(n for n in m.files if n.endswith(".distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]  # each rank wrote its own shard
    assert {".metadata", "rank-00000.json", "rank-00001.json"} <= set(m.files)
    for name, entry in m.files.items():  # the checksums are those of the bytes on disk
        data = (tmp_path / "ckpt" / "step-000000000004" / name).read_bytes()
        assert entry.size == len(data) and entry.size > 0
        assert entry.digest == f"{zlib.crc32(data):08x}"

    _run(_ddp_resume_worker, tmp_path, 4)  # intact: the newest

    shard = tmp_path / "ckpt" / "step-000000000004" / shards[1]  # rank 1's shard
    if damage == "bitflip":
        raw = bytearray(shard.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        shard.write_bytes(bytes(raw))
    else:
        shard.unlink()
    _run(_ddp_resume_worker, tmp_path, 2)
    skipped = [json.loads((tmp_path / f"resumed-{r}.json").read_text()) for r in range(WORLD)]
    reason = "missing" if damage == "missing" else "crc32 does not match"
    # rank 1 checks every other file (its share); both ranks agree and report the same step
    assert all(len(s) == 1 and s[0].startswith("step-000000000004") for s in skipped)
    assert any(reason in s[0] for s in skipped)
    assert not (tmp_path / "ckpt" / "step-000000000004").exists()  # quarantined


def test_the_old_state_pt_layout_still_loads_next_to_sharded_ones(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    _train_step(model, opt, 1, 0)
    old = CheckpointManager(CheckpointConfig(tmp_path, allow_tmp=True), job_id="j")
    old.save(1, 16, model, opt)
    new = CheckpointManager(CheckpointConfig(tmp_path, allow_tmp=True, layout=mf.LAYOUT_DCP),
                            job_id="j")
    _train_step(model, opt, 2, 0)
    new.save(2, 32, model, opt)
    new.wait()
    (tmp_path / "step-000000000002" / "__0_0.distcp").unlink()  # the sharded one is broken
    model2 = _net()
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.01)
    restored = new.resume(model2, opt2)
    assert restored is not None and restored.progress.step == 1  # the state.pt one
    assert mf.decode((tmp_path / "step-000000000001" / mf.MANIFEST_NAME).read_bytes()).format == 1


# -- sharded async saves: FSDP2 ----------------------------------------------------------------


def _fsdp_model() -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (WORLD,))
    model = _net()
    for layer in model.children():
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp_worker(rank: int, tmp_path: Path, phase: str) -> None:
    torch.manual_seed(0 if phase == "save" else 77)
    model = _fsdp_model()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    mgr = _manager(tmp_path / "ckpt", layout=mf.LAYOUT_DCP, every_steps=3)
    if phase == "save":
        for step in range(1, 4):
            _train_step(model, opt, step, rank)
            if mgr.due(step):
                mgr.save(step, step * 16, model, opt)
                snapshot = {"params": _full(model), "optim": _optim_full(opt)}
                _train_step(model, opt, step + 1, rank)  # training goes on during the write
                if rank == 0:
                    torch.save(snapshot, tmp_path / "expected.pt")
        mgr.close()
        return
    restored = mgr.resume(model, opt)
    assert restored is not None and restored.progress.step == 3
    expected = torch.load(tmp_path / "expected.pt", weights_only=True)
    got = _full(model)
    for name, tensor in expected["params"].items():
        assert torch.equal(got[name], tensor), name
    for a, b in zip(_optim_full(opt), expected["optim"], strict=True):
        assert torch.equal(a, b)
    _train_step(model, opt, 4, rank)  # and it trains on


def test_fsdp2_fully_shard_on_cpu_saves_each_ranks_shard_and_loads_back(
        tmp_path: Path) -> None:
    _run(_fsdp_worker, tmp_path, "save")
    m = _committed(tmp_path / "ckpt")[3]
    shards = {n: e for n, e in m.files.items() if n.endswith(".distcp")}
    assert sorted(shards) == ["__0_0.distcp", "__1_0.distcp"]
    assert len({e.digest for e in shards.values()}) == 2  # different halves of the model
    _run(_fsdp_worker, tmp_path, "load")
