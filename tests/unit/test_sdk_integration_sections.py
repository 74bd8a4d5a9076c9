"""The Lightning and Hugging Face callbacks mark the sections of a step from their
frameworks' hooks (called here in the frameworks' order, on stand-in trainers: no training,
no Kafka), and pass the layout to the identity."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from torch import nn
from trainguard_sdk import Layout, Section

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "TRAINGUARD_RANK", "SLURM_PROCID", "TRAINGUARD_JOB_ID",
                 "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")


class Reporter:
    """A StepReporter stand-in: what its heartbeats would say, in order."""

    def __init__(self) -> None:
        self.log: list[str] = []

    def section(self, section: Section) -> None:
        self.log.append(section.name.lower())

    def end_section(self) -> None:
        self.log.append("-")

    def step(self, step: int, samples_consumed: int, compute_ms: float, **kw: Any) -> bool:
        self.log.append(f"step {step}")
        return True

    def heartbeat(self, phase: str = "step") -> bool:
        self.log.append(f"phase {phase}")
        return True

    def checkpoint(self, action: str, step: int, samples_consumed: int, path: str,
                   **kw: Any) -> bool:
        self.log.append(f"{action} {step}")
        return True

    def leaving(self, exit_code: int, cause: str = "error", reason: str | None = None) -> bool:
        self.log.append(f"leaving {exit_code} {cause}")
        return True

    def departing(self, exc: BaseException) -> bool:
        self.log.append(f"departing {type(exc).__name__}")
        return True

    def close(self) -> None:
        self.log.append("close")


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)


def test_lightning_callback_sections(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    from lightning.fabric.plugins import TorchCheckpointIO
    from trainguard_sdk.integrations.lightning import TrainguardCallback

    tg = Reporter()
    cb = TrainguardCallback(job_id="j", reporter=tg, layout=Layout(tp=2))
    strategy: Any = SimpleNamespace(checkpoint_io=TorchCheckpointIO(), model=nn.Linear(2, 2))
    trainer: Any = SimpleNamespace(global_rank=3, world_size=4, global_step=0, strategy=strategy)
    module: Any = None
    cb.setup(trainer, module, "fit")
    assert cb.identity is not None
    assert (cb.identity.dp_rank, cb.identity.tp_rank, cb.identity.tp_size) == (1, 1, 2)
    cb.on_fit_start(trainer, module)
    cb.on_validation_start(trainer, module)  # the sanity check
    cb.on_validation_end(trainer, module)
    for micro in (0, 1):  # one optimizer step of two micro-batches
        cb.on_train_batch_start(trainer, module, [[0.0]] * 4, micro)
        cb.on_before_backward(trainer, module, None)
        cb.on_after_backward(trainer, module)
        if micro == 1:
            cb.on_before_optimizer_step(trainer, module, None)
            trainer.global_step = 1
        cb.on_train_batch_end(trainer, module, None, None, micro)
    cb.on_save_checkpoint(trainer, module, {})  # ModelCheckpoint, every rank
    strategy.checkpoint_io.save_checkpoint({"global_step": 1}, tmp_path / "a.ckpt")  # the writer
    cb.teardown(trainer, module, "fit")
    assert tg.log == [
        "-", "data",
        "forward", "backward", "optimizer", "data",
        "forward", "backward", "optimizer", "optimizer", "step 1", "data",
        "checkpoint", "checkpoint", "phase checkpoint", "written 1", "data",
        "leaving 0 completed", "close"]


def test_lightning_callback_says_the_departure_before_its_teardown_closes() -> None:
    # Lightning calls on_exception, then tears down (the reporter closes), then re-raises:
    # by the time the excepthook runs the reporter is closed, so the callback says it
    pytest.importorskip("lightning")
    from lightning.fabric.plugins import TorchCheckpointIO
    from trainguard_sdk.integrations.lightning import TrainguardCallback

    tg = Reporter()
    cb = TrainguardCallback(job_id="j", reporter=tg)
    strategy: Any = SimpleNamespace(checkpoint_io=TorchCheckpointIO(), model=nn.Linear(2, 2))
    trainer: Any = SimpleNamespace(global_rank=0, world_size=2, global_step=0, strategy=strategy)
    module: Any = None
    cb.setup(trainer, module, "fit")
    cb.on_exception(trainer, module, RuntimeError("Connection closed by peer"))
    cb.teardown(trainer, module, "fit")
    assert tg.log == ["departing RuntimeError", "close"]  # no completion after a failure


def test_hugging_face_callback_sections(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from trainguard_sdk.integrations.hf import TrainguardCallback

    tg = Reporter()
    cb = TrainguardCallback(job_id="j", reporter=tg, layout=Layout(pp=2))
    args: Any = SimpleNamespace(process_index=1, world_size=2, per_device_train_batch_size=4,
                           gradient_accumulation_steps=1, output_dir=str(tmp_path))
    state: Any = SimpleNamespace(global_step=0, is_world_process_zero=True)
    control: Any = SimpleNamespace(should_save=False, should_evaluate=False)
    cb.on_train_begin(args, state, control, model=nn.Linear(2, 2))
    assert cb.identity is not None and (cb.identity.pp_stage, cb.identity.pp_size) == (1, 2)
    for step, save, evaluate in ((1, False, False), (2, True, False), (3, True, True)):
        cb.on_step_begin(args, state, control)
        cb.on_pre_optimizer_step(args, state, control)
        cb.on_optimizer_step(args, state, control)
        state.global_step = step
        control.should_save, control.should_evaluate = save, evaluate
        cb.on_step_end(args, state, control)
        if evaluate:
            cb.on_evaluate(args, state, control)
        if save:
            cb.on_save(args, state, control)
    cb.on_train_end(args, state, control)
    assert tg.log == [
        "forward", "optimizer", "step 1", "data",
        "forward", "optimizer", "step 2", "data", "checkpoint", "phase checkpoint",
        "data", "written 2",
        "forward", "optimizer", "step 3", "data", "-",  # evaluation: no section
        "checkpoint", "phase checkpoint", "data", "written 3", "leaving 0 completed", "close"]
