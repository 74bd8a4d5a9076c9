"""The async save's staging: the staged state equals the state at save time (not after),
the buffers are made once and reused, odd tensors (non-contiguous, views, scalars, empty)
are copied right, and a change of structure makes new buffers."""

from __future__ import annotations

import torch
from trainguard_sdk.checkpoint.sharded import ReusingStager


def _state() -> dict[str, object]:
    base = torch.randn(8, 6)
    return {"model": {"w": torch.randn(64, 32), "t": base.t(), "view": base[2:5],
                      "empty": torch.empty(0), "i": torch.arange(7, dtype=torch.int64)},
            "optim": {"state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(5)}},
                      "param_groups": [{"lr": 0.1, "params": [0]}]}}


def _tensors(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, list):
        return [t for v in obj for t in _tensors(v)]
    return [obj] if isinstance(obj, torch.Tensor) else []


def test_staged_copy_is_the_state_at_save_time_in_reused_buffers() -> None:
    state = _state()
    stager = ReusingStager()
    staged = stager.stage(state)
    before = [t.clone() for t in _tensors(state)]
    assert all(torch.equal(a, b) for a, b in zip(_tensors(staged), before, strict=True))
    assert staged["optim"]["param_groups"] == [{"lr": 0.1, "params": [0]}]
    ptrs = [t.data_ptr() for t in _tensors(staged)]
    for t in _tensors(state):  # training goes on: the staged copy does not move
        t.add_(1)
    assert all(torch.equal(a, b) for a, b in zip(_tensors(staged), before, strict=True))
    again = stager.stage(state)
    assert [t.data_ptr() for t in _tensors(again)] == ptrs  # no new buffers
    assert all(torch.equal(a, b) for a, b in zip(_tensors(again), _tensors(state), strict=True))


def test_a_new_structure_gets_new_buffers() -> None:
    stager = ReusingStager()
    first = stager.stage({"w": torch.ones(4)})
    second = stager.stage({"w": torch.ones(5) * 2})
    assert torch.equal(second["w"], torch.full((5,), 2.0)) and first["w"].shape == (4,)
