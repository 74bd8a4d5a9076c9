"""The framework-free part of the Lightning / Hugging Face callbacks (``integrations.core``):
which step a timing is reported under, samples, data wait, checkpoint records, identity; and
that the callback modules skip cleanly where their framework is absent."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from trainguard_sdk import Layout
from trainguard_sdk.integrations.core import (
    StepLoop,
    WallTimer,
    WallTiming,
    batch_size,
    dir_size,
    resolve_identity,
)
from trainguard_sdk.wire import Section


class FakeClock:
    def __init__(self) -> None:
        self.ns = 0

    def __call__(self) -> int:
        return self.ns

    def advance(self, ms: float) -> None:
        self.ns += int(ms * 1e6)


@dataclass
class Sink:
    steps: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[tuple[Any, ...]] = field(default_factory=list)
    # what the heartbeats would say, in order: a section's name, "step N" (a report, which
    # ends the section) or "-" (no section)
    sections: list[str] = field(default_factory=list)

    def step(self, step: int, samples_consumed: int, compute_ms: float,
             comm_ms: float | None = None, data_wait_ms: float | None = None,
             step_ms: float | None = None, loss: float | None = None,
             shard_offset: int | None = None) -> bool:
        self.steps.append({"step": step, "samples": samples_consumed, "compute": compute_ms,
                           "comm": comm_ms, "wait": data_wait_ms, "step_ms": step_ms,
                           "loss": loss})
        self.sections.append(f"step {step}")
        return True

    def section(self, section: Section) -> None:
        self.sections.append(section.name.lower())

    def end_section(self) -> None:
        self.sections.append("-")

    def heartbeat(self, phase: str = "step") -> bool:
        return True

    def checkpoint(self, action: str, step: int, samples_consumed: int, path: str, *,
                   sha256: str | None = None, size_bytes: int | None = None,
                   write_ms: float | None = None, reason: str | None = None) -> bool:
        self.checkpoints.append((action, step, samples_consumed, path, size_bytes, write_ms))
        return True


@dataclass(frozen=True)
class HookTiming:
    index: int
    compute_ms: float
    comm_ms: float
    step_ms: float


class LaggingTimer:
    """Like StepTimer on CUDA: stop() gives the previous start's figures."""

    def __init__(self) -> None:
        self.index = -1

    def start(self) -> None:
        self.index += 1

    def stop(self) -> HookTiming | None:
        if self.index < 1:
            return None
        i = self.index - 1
        return HookTiming(i, float(i), 1.0, 10.0 + i)

    def flush(self) -> HookTiming | None:
        i = self.index
        return None if i < 0 else HookTiming(i, float(i), 1.0, 10.0 + i)


def test_wall_timer_reports_the_whole_step_as_compute_and_no_comm() -> None:
    clock, sink = FakeClock(), Sink()
    loop = StepLoop(sink, world_size=4, clock=clock)
    loop.timer = WallTimer(clock)
    for step in (1, 2):
        loop.begin()
        loop.add_batch(8)
        clock.advance(30)
        assert loop.end(step)
        clock.advance(5)  # the loop's work and the next batch's loading
    assert sink.steps == [
        {"step": 1, "samples": 32, "compute": 30.0, "comm": None, "wait": None,
         "step_ms": 30.0, "loss": None},
        {"step": 2, "samples": 64, "compute": 30.0, "comm": None, "wait": 5.0,
         "step_ms": 30.0, "loss": None}]


def test_micro_batches_of_one_optimizer_step_are_one_report() -> None:
    clock, sink = FakeClock(), Sink()
    loop = StepLoop(sink, world_size=2, clock=clock)
    loop.timer = WallTimer(clock)
    for _ in range(4):  # gradient accumulation: begin() per micro-batch
        loop.begin()
        loop.add_batch(3)
        clock.advance(10)
    assert loop.end(1, loss=0.5)
    assert not loop.end(1)  # nothing running: nothing reported
    assert [(s["step"], s["samples"], s["compute"], s["loss"]) for s in sink.steps] == [
        (1, 24, 40.0, 0.5)]


def test_a_timer_one_step_late_is_reported_under_its_own_step() -> None:
    sink = Sink()
    loop = StepLoop(sink, world_size=1, clock=FakeClock())
    loop.timer = LaggingTimer()
    sent = []
    for step in (10, 11, 12):
        loop.begin()
        loop.add_batch(2)
        sent.append(loop.end(step, loss=float(step)))
    assert sent == [False, True, True]
    # the figures of start 0 under step 10 with step 10's samples and loss
    assert [(s["step"], s["samples"], s["compute"], s["comm"], s["loss"]) for s in sink.steps] \
        == [(10, 2, 0.0, 1.0, 10.0), (11, 4, 1.0, 1.0, 11.0)]
    assert len(loop._pending) == 1  # only the step whose figures are still to come
    assert loop.flush()  # after training: the last step's figures
    assert not loop.flush()  # once
    assert [(s["step"], s["samples"], s["compute"], s["loss"]) for s in sink.steps][-1] == (
        12, 6, 2.0, 12.0)


def test_flush_without_a_lagging_timer_reports_nothing() -> None:
    sink = Sink()
    loop = StepLoop(sink, world_size=1, clock=FakeClock())
    loop.begin()
    loop.end(1)
    assert not loop.flush() and [s["step"] for s in sink.steps] == [1]


def _lightning_step(loop: StepLoop, step: int, micro: int = 1) -> None:
    """Lightning's hook order for one optimizer step of ``micro`` micro-batches."""
    for m in range(micro):
        loop.begin()                 # on_train_batch_start
        loop.backward()              # on_before_backward
        loop.optimizer()             # on_after_backward
        if m == micro - 1:
            loop.optimizer()         # on_before_optimizer_step
            loop.end(step)           # on_train_batch_end, the step done
        else:
            loop.data()              # on_train_batch_end of a micro-batch


def test_sections_follow_lightnings_hooks() -> None:
    sink = Sink()
    loop = StepLoop(sink, world_size=1, clock=FakeClock())
    _lightning_step(loop, 1)
    _lightning_step(loop, 2, micro=2)
    loop.checkpoint()                # on_save_checkpoint (ModelCheckpoint at the batch's end)
    loop.checkpoint_written(2, "/c/step=2.ckpt")
    loop.data()                      # the writer, once its file is written
    loop.outside()                   # on_validation_start
    loop.data()                      # on_validation_end
    assert sink.sections == [
        "forward", "backward", "optimizer", "optimizer", "step 1", "data",
        "forward", "backward", "optimizer", "data",
        "forward", "backward", "optimizer", "optimizer", "step 2", "data",
        "checkpoint", "data", "-", "data"]


def test_sections_follow_hugging_faces_hooks_with_a_lagging_timer() -> None:
    """The Trainer: no backward hook; with figures one step late the first step reports
    nothing, and its data section follows all the same."""
    sink = Sink()
    loop = StepLoop(sink, world_size=1, clock=FakeClock())
    loop.timer = LaggingTimer()
    for step in (1, 2):
        loop.begin()                 # on_step_begin
        loop.optimizer()             # on_pre_optimizer_step
        loop.end(step)               # on_step_end
    loop.checkpoint()                # on_step_end, control.should_save
    loop.data()                      # on_save
    loop.outside()                   # on_step_end, control.should_evaluate
    loop.data()                      # on_evaluate
    assert sink.sections == [
        "forward", "optimizer", "data",
        "forward", "optimizer", "step 1", "data",
        "checkpoint", "data", "-", "data"]


def test_checkpoint_written_carries_the_samples_so_far() -> None:
    sink = Sink()
    loop = StepLoop(sink, world_size=2, clock=FakeClock(), samples=100)
    loop.begin()
    loop.add_batch(5)
    loop.end(7)
    assert loop.checkpoint_written(7, "/ckpt/step-7", size_bytes=3, write_ms=1.5)
    assert sink.checkpoints == [("written", 7, 110, "/ckpt/step-7", 3, 1.5)]


def test_wall_timer_before_start() -> None:
    assert WallTimer().stop() is None
    assert WallTiming(0, 1.0, 1.0).comm_ms == 0.0


@pytest.mark.parametrize(("batch", "n"), [
    ([[1, 2], [3, 4]], None),  # plain lists have no shape
    ({"input_ids": type("T", (), {"shape": (7, 16)})()}, 7),
    ((type("T", (), {"shape": ()})(), type("T", (), {"shape": (5,)})()), 5),
    ("text", None),
    (None, None),
])
def test_batch_size(batch: object, n: int | None) -> None:
    assert batch_size(batch) == n


def test_dir_size(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"x" * 10)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b").write_bytes(b"y" * 5)
    assert dir_size(str(tmp_path)) == 15
    assert dir_size(str(tmp_path / "a")) == 10
    assert dir_size(str(tmp_path / "missing")) is None


def test_identity_from_the_launcher_first_else_the_framework() -> None:
    torchrun = {"RANK": "1", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "job-a"}
    ident = resolve_identity(3, 8, torchrun)  # the launcher wins over the framework
    assert (ident.rank, ident.world_size, ident.launcher) == (1, 4, "torchelastic")
    own = {"LOCAL_RANK": "1", "TRAINGUARD_JOB_ID": "job-b"}  # Lightning's own launcher
    ident = resolve_identity(1, 2, own)
    assert (ident.rank, ident.world_size, ident.launcher, ident.job_id) == (
        1, 2, "explicit", "job-b")
    ident = resolve_identity(0, 1, {"TRAINGUARD_JOB_ID": "job-c"})
    assert (ident.rank, ident.world_size, ident.launcher) == (0, 1, "single")


def test_a_layout_applies_to_the_frameworks_rank_too() -> None:
    """Under a framework's own launcher the layout is not checked against a world of 1."""
    ident = resolve_identity(3, 4, {"LOCAL_RANK": "1", "TRAINGUARD_JOB_ID": "j"},
                             layout=Layout(tp=2))
    assert (ident.launcher, ident.rank, ident.dp_rank, ident.tp_rank, ident.tp_size) == (
        "explicit", 3, 1, 1, 2)


@pytest.mark.parametrize(("module", "framework"), [
    ("trainguard_sdk.integrations.lightning", "lightning"),
    ("trainguard_sdk.integrations.hf", "transformers"),
])
def test_callback_modules_need_only_their_framework(module: str, framework: str) -> None:
    """Where the framework is installed the callback imports; where not, this skips (the
    SDK's bare test venvs) and ``import trainguard_sdk`` never pulled it in."""
    import trainguard_sdk  # noqa: F401

    pytest.importorskip(framework)
    mod = importlib.import_module(module)
    assert callable(mod.TrainguardCallback)


def test_importing_the_sdk_imports_no_framework() -> None:
    import subprocess

    code = ("import sys, trainguard_sdk, trainguard_sdk.integrations, "
            "trainguard_sdk.integrations.core; "
            "print(sorted(m for m in ('torch', 'lightning', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
