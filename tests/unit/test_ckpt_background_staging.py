"""``stage_in_background``: save() clones the buffers only; the parameters and the optimizer
state are copied on the save's thread while the next forward and backward run, and the
optimizer's next step() waits for the copy. What is written is the state at save time: the
parameters and moments before the next step, the buffers before the next forward (BatchNorm's
running statistics change there)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from trainguard_sdk.checkpoint import manifest as mf
from trainguard_sdk.checkpoint import sharded
from trainguard_sdk.checkpoint.manager import CheckpointConfig, CheckpointManager

pytestmark = pytest.mark.unit


def _net() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=0.05)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(32, 8, generator=g), torch.randint(0, 2, (32,), generator=g)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()  # type: ignore[no-untyped-call]
    opt.step()


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = [t.detach().clone() for t in model.state_dict().values()]
    for per_param in opt.state.values():
        out += [v.detach().clone() for v in per_param.values() if isinstance(v, torch.Tensor)]
    return out


def _manager(root: Path, **kw: Any) -> CheckpointManager:
    cfg = CheckpointConfig(root, allow_tmp=True, layout=mf.LAYOUT_DCP, **kw)
    return CheckpointManager(cfg, job_id="job-1")


class SlowStage:
    """The staging copy starts only after the training thread went on into the next step."""

    def __init__(self, stager: sharded.ReusingStager, release: threading.Event) -> None:
        self.stager, self.release = stager, release

    def stage(self, state: dict[str, Any]) -> dict[str, Any]:
        self.release.wait(10)
        time.sleep(0.2)
        return self.stager.stage(state)


def test_the_checkpoint_is_the_state_at_save_time_and_the_step_waits_for_the_copy(
        tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, opt = _net()
    for s in range(3):
        _step(model, opt, s)
    mgr = _manager(tmp_path / "ckpt", stage_in_background=True)
    at_save = _snapshot(model, opt)
    forward_done = threading.Event()
    mgr._stager = SlowStage(sharded.ReusingStager(), forward_done)
    assert mgr.save(3, 96, model, opt) is None  # staged in the background
    # the next step: its forward changes the BatchNorm statistics at once, its step() the
    # parameters and moments, while the copy has not started yet
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(32, 8, generator=g), torch.randint(0, 2, (32,), generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    forward_done.set()
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()  # waits for the staging copy
    assert mgr.last_step_wait_ms is not None and mgr.last_step_wait_ms > 50
    valid = mgr.wait()
    assert valid is not None and valid.manifest.step == 3
    after = _snapshot(model, opt)
    assert not all(torch.equal(a, b) for a, b in zip(at_save, after, strict=True))

    model2, opt2 = _net()
    _step(model2, opt2, 99)  # the moments exist, with other values
    restored = _manager(tmp_path / "ckpt").resume(model2, opt2)
    assert restored is not None and restored.progress.step == 3
    got = _snapshot(model2, opt2)
    assert len(got) == len(at_save)
    assert all(torch.equal(a, b) for a, b in zip(at_save, got, strict=True))
    mgr.close()
    _step(model, opt, 4)  # the hook is gone with close(): nothing waits, nothing breaks


def test_a_failed_copy_does_not_hold_the_training_thread(tmp_path: Path) -> None:
    model, opt = _net()
    _step(model, opt, 0)
    mgr = _manager(tmp_path / "ckpt", stage_in_background=True)

    class Broken:
        def stage(self, state: dict[str, Any]) -> dict[str, Any]:
            raise MemoryError("no room for the staging buffers")

    mgr._stager = Broken()
    assert mgr.save(1, 32, model, opt) is None
    _step(model, opt, 1)  # returns: the hook does not wait for a copy that failed
    with pytest.raises(OSError, match="no room for the staging buffers"):
        mgr.wait()
