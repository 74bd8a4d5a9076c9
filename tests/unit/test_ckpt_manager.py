"""CheckpointManager in one process (torch, CPU): save/resume exactness including RNG
states, fallback past a corrupt newest checkpoint (truncated or bit-flipped), keep-K, the
save requests (file, signal, call), rank agreement, and the records sent to the sink."""

from __future__ import annotations

import hashlib
import os
import random
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from trainguard_sdk.checkpoint.location import CheckpointLocationError
from trainguard_sdk.checkpoint.manager import (
    STATE_FILE,
    CheckpointConfig,
    CheckpointIncompatible,
    CheckpointManager,
    rank_file,
)
from trainguard_sdk.checkpoint.store import Valid


@dataclass
class Record:
    action: str
    step: int
    samples_consumed: int
    path: str
    kw: dict[str, Any]


@dataclass
class Sink:
    records: list[Record] = field(default_factory=list)

    def checkpoint(self, action: str, step: int, samples_consumed: int, path: str, *,
                   sha256: str | None = None, size_bytes: int | None = None,
                   write_ms: float | None = None, reason: str | None = None) -> bool:
        self.records.append(Record(action, step, samples_consumed, path,
                                   {"sha256": sha256, "size_bytes": size_bytes,
                                    "write_ms": write_ms, "reason": reason}))
        return True

    def actions(self) -> list[tuple[str, int]]:
        return [(r.action, r.step) for r in self.records]


def _net() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Dropout(0.3),
                                torch.nn.Linear(16, 2))
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, step: int) -> float:
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 2, (16,), generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    return float(loss.item()) + random.random()  # the Python RNG is part of the outcome


def _manager(root: Path, sink: Sink | None = None, **kw: Any) -> CheckpointManager:
    cfg = CheckpointConfig(root, allow_tmp=True, **kw)
    return CheckpointManager(cfg, job_id="job-1", sink=sink)


def test_resume_restores_model_optimizer_progress_and_rng_exactly(tmp_path: Path) -> None:
    torch.manual_seed(0)
    random.seed(0)
    model, opt = _net()
    sink = Sink()
    mgr = _manager(tmp_path, sink, every_steps=3)
    for step in range(1, 4):
        _train(model, opt, step)
    saved = mgr.save(3, 3 * 16, model, opt, extra={"cursor": 48})
    assert saved is not None
    expected = [_train(model, opt, s) for s in (4, 5, 6)]
    params = [p.detach().clone() for p in model.parameters()]

    torch.manual_seed(123)  # another init and another RNG position: resume must undo both
    random.seed(123)
    model2, opt2 = _net()
    restored = _manager(tmp_path, sink).resume(model2, opt2)
    assert restored is not None
    assert (restored.progress.step, restored.progress.samples_consumed) == (3, 48)
    assert restored.extra == {"cursor": 48}
    assert set(restored.rng) >= {"python", "torch"}
    got = [_train(model2, opt2, s) for s in (4, 5, 6)]
    assert got == expected  # bit-exact: same weights, moments, dropout masks, Python draws
    assert all(torch.equal(a, b) for a, b in zip(params, model2.parameters(), strict=True))
    written = sink.records[0]
    manifest_bytes = (saved.path / "MANIFEST.json").read_bytes()
    assert written.action == "written" and written.kw["sha256"] == hashlib.sha256(
        manifest_bytes).hexdigest()
    assert written.kw["size_bytes"] == sum(
        (saved.path / n).stat().st_size for n in (STATE_FILE, rank_file(0)))
    assert sink.actions() == [("written", 3), ("verified", 3), ("loaded", 3)]


@pytest.mark.parametrize("damage", ["truncate", "bitflip"])
def test_corrupt_newest_falls_back_to_the_previous(tmp_path: Path, damage: str) -> None:
    torch.manual_seed(0)
    model, opt = _net()
    mgr = _manager(tmp_path, keep=3)
    weights = {}
    for step in (2, 4, 6):
        _train(model, opt, step)
        mgr.save(step, step * 16, model, opt)
        weights[step] = [p.detach().clone() for p in model.parameters()]
    state = tmp_path / "step-000000000006" / STATE_FILE
    raw = bytearray(state.read_bytes())
    if damage == "truncate":
        del raw[len(raw) // 2:]
    else:
        raw[len(raw) // 2] ^= 0x04
    state.write_bytes(bytes(raw))

    sink = Sink()
    model2, opt2 = _net()
    restored = _manager(tmp_path, sink, keep=3).resume(model2, opt2)
    assert restored is not None and restored.progress.step == 4
    assert all(torch.equal(a, b) for a, b in zip(weights[4], model2.parameters(), strict=True))
    assert sink.actions() == [("corrupt", 6), ("verified", 4), ("loaded", 4)]
    reason = sink.records[0].kw["reason"]
    assert reason.startswith(STATE_FILE) and ("bytes" in reason or "sha256" in reason)
    assert sink.records[0].samples_consumed == 96
    assert not (tmp_path / "step-000000000006").exists()  # moved aside, as evidence
    assert [p.name.startswith("step-000000000006-") for p in
            (tmp_path / "quarantine").iterdir()] == [True]


def test_nothing_valid_is_a_fresh_start(tmp_path: Path) -> None:
    model, opt = _net()
    mgr = _manager(tmp_path)
    mgr.save(1, 16, model, opt)
    (tmp_path / "step-000000000001" / "MANIFEST.json").write_text("{}")
    (tmp_path / "step-000000000002").mkdir()  # never committed
    sink = Sink()
    assert _manager(tmp_path, sink).resume(*_net()) is None
    assert sink.actions() == [("corrupt", 1)]  # the uncommitted one is not a corruption
    assert mgr.store.steps() == []


def test_keep_k(tmp_path: Path) -> None:
    model, opt = _net()
    mgr = _manager(tmp_path, keep=2)
    for step in range(1, 6):
        mgr.save(step, step, model, opt)
    mgr.close()  # pruning runs off the training thread
    assert [s for s, _ in mgr.store.steps()] == [4, 5]


def test_tmp_is_refused_unless_allowed(tmp_path: Path) -> None:
    with pytest.raises(CheckpointLocationError, match=r"directory .*allow_tmp"):
        CheckpointManager(CheckpointConfig(tmp_path), job_id="job-1")


def test_save_requests_file_signal_and_call(tmp_path: Path) -> None:
    mgr = _manager(tmp_path, every_steps=10, poll_every=1)
    assert [mgr.due(s) for s in (1, 2, 10)] == [False, False, True]
    (tmp_path / "SAVE_NOW").touch()
    assert mgr.due(11) and not (tmp_path / "SAVE_NOW").exists()
    assert not mgr.due(12)
    old = signal.getsignal(signal.SIGUSR1)
    try:
        mgr.install_request_signal()
        os.kill(os.getpid(), signal.SIGUSR1)
        assert mgr.due(13) and not mgr.due(14)
    finally:
        signal.signal(signal.SIGUSR1, old)
    mgr.request_save()
    assert mgr.due(15) and not mgr.due(16)


@dataclass
class TwoRanks:
    """Rank 0 of a 2-rank job whose peer's answers are scripted."""

    peer_valid: dict[int, bool]
    rank: int = 0
    world_size: int = 2
    calls: list[Any] = field(default_factory=list)
    order: list[int] = field(default_factory=list)

    def all_gather(self, obj: Any) -> list[Any]:
        self.calls.append(obj)
        if isinstance(obj, bool):
            step = self.checking
            return [obj, self.peer_valid.get(step, True)]
        if isinstance(obj, list):  # the step listing
            if obj:
                self.order = sorted(obj, reverse=True)
            return [obj, obj]
        return [obj, {}]

    def any(self, flag: bool) -> bool:
        return flag

    @property
    def checking(self) -> int:
        return self.order[sum(isinstance(c, bool) for c in self.calls) - 1]


def test_ranks_agree_on_a_checkpoint_every_rank_finds_valid(tmp_path: Path) -> None:
    model, opt = _net()
    peers = TwoRanks(peer_valid={})
    mgr = CheckpointManager(CheckpointConfig(tmp_path, allow_tmp=True), job_id="job-1",
                            collective=peers)
    for step in (4, 8):
        assert isinstance(mgr.save(step, step, model, opt), Valid)
    peers2 = TwoRanks(peer_valid={8: False})
    sink = Sink()
    mgr2 = CheckpointManager(CheckpointConfig(tmp_path, allow_tmp=True), job_id="job-1",
                             collective=peers2, sink=sink)
    restored = mgr2.resume(*_net())
    assert restored is not None and restored.progress.step == 4
    assert restored.skipped == ["step-000000000008: found invalid by rank(s) [1]"]
    assert sink.actions() == [("verified", 4), ("loaded", 4)]


def test_another_world_size_is_refused(tmp_path: Path) -> None:
    model, opt = _net()
    _manager(tmp_path).save(2, 2, model, opt)
    mgr = CheckpointManager(CheckpointConfig(tmp_path, allow_tmp=True), job_id="job-1",
                            collective=TwoRanks(peer_valid={}))
    with pytest.raises(CheckpointIncompatible, match="world_size"):
        mgr.resume(*_net())
