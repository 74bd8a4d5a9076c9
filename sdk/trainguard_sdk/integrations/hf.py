"""Hugging Face ``transformers.Trainer``: ``TrainguardCallback``.

    from trainguard_sdk.integrations.hf import TrainguardCallback

    trainer = Trainer(model=model, args=args, train_dataset=train)
    TrainguardCallback.attach(trainer)      # or Trainer(..., callbacks=[TrainguardCallback()])

What it does, per rank:

- identity from the launcher (``identity_from_env``: torchrun, Slurm, trainguard's actuator;
  else the Trainer's process index and world size); a ``StepReporter`` to the node agent,
  whose daemon thread heartbeats;
- a step report after every optimizer step (``on_step_begin`` .. ``on_step_end``; gradient
  accumulation's micro-steps are inside it), with this rank's compute timed by
  ``trainguard_sdk.ddp.StepTimer``, whose communication hook is installed at
  ``on_train_begin`` on ``trainer.model_wrapped`` (accelerate's ``DistributedDataParallel``),
  so DDP's overlap is kept. That needs the trainer: ``attach(trainer)`` gives it. A callback
  given in ``callbacks=[...]`` never sees the wrapped model and times the whole step by the
  wall clock (``timing`` says which);
- samples consumed: ``global_step * per_device_train_batch_size * gradient_accumulation_steps
  * world_size`` (a short last batch is counted full);
- a ``checkpoint`` record ("written": ``output_dir/checkpoint-<step>``, its size, and the time
  from the step's end to ``on_save``, i.e. the Trainer's save) from the process that writes
  it (``is_world_process_zero``), which heartbeats phase "checkpoint" meanwhile;
- sections for the section-hang rule: forward from ``on_step_begin`` (the Trainer has no
  backward hook: forward and backward are one section), comm at this rank's last gradient
  bucket (the ``StepTimer``), optimizer from ``on_pre_optimizer_step``, data from
  ``on_step_end`` (the next batches load), checkpoint from ``on_step_end`` / ``on_epoch_end``
  when the Trainer will save (every rank) until ``on_save``, none while it evaluates (until
  ``on_evaluate``);
- the layout (dp/pp/tp) given as ``layout=`` (``Layout(...)``, ``Layout.from_mesh(...)``);
- the reporter closes at ``on_train_end`` (after the last step's figures, which on CUDA come
  one step late, and a last "idle" heartbeat), saying the rank completed (``leaving(0,
  "completed")``); an exception out of ``train()`` never gets there, and the SDK's excepthook
  says that one.

The lazy import: ``import trainguard_sdk`` never imports transformers; this module does.
"""

from __future__ import annotations

import os
import time
from typing import Any

from transformers import TrainerCallback

from trainguard_sdk.identity import Identity, Layout
from trainguard_sdk.integrations._torch import timer_for
from trainguard_sdk.integrations.core import StepLoop, dir_size, resolve_identity

CHECKPOINT_PREFIX = "checkpoint"  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR


class TrainguardCallback(TrainerCallback):
    def __init__(self, *, job_id: str | None = None, trainer: Any = None, hook: Any = None,
                 state: Any = None, reporter: Any = None, layout: Layout | None = None,
                 **reporter_kwargs: Any) -> None:
        """``trainer``: the Trainer (``attach`` sets it), to find its DDP model. ``hook``/
        ``state``: your DDP communication hook (wrapped by the timer). ``reporter``: a ready
        ``StepReporter`` (else one is made for this rank, with ``reporter_kwargs``).
        ``layout``: the parallel layout (default: data-parallel only)."""
        self.job_id = job_id
        self.layout = layout
        self.trainer = trainer
        self.hook, self.hook_state = hook, state
        self.reporter: Any = reporter
        self.reporter_kwargs = reporter_kwargs
        self.identity: Identity | None = None
        self.loop: StepLoop | None = None
        self.timing = "not started"
        self._save_from: float | None = None
        self._per_step = 0

    @classmethod
    def attach(cls, trainer: Any, **kwargs: Any) -> TrainguardCallback:
        """Add a callback that knows ``trainer`` (so it can time with the DDP hook)."""
        callback = cls(trainer=trainer, **kwargs)
        trainer.add_callback(callback)
        return callback

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.loop is None:
            self.identity = resolve_identity(args.process_index, args.world_size,
                                             job_id=self.job_id, layout=self.layout)
            if self.reporter is None:
                self.reporter = self.identity.reporter(**self.reporter_kwargs)
            per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
            self._per_step = per_step
            self.loop = StepLoop(self.reporter, self.identity.world_size,
                                 samples=state.global_step * per_step * self.identity.world_size)
        model = getattr(self.trainer, "model_wrapped", None) if self.trainer is not None else None
        self.loop.timer, self.timing = timer_for(model if model is not None
                                                 else kwargs.get("model"),
                                                 hook=self.hook, state=self.hook_state,
                                                 reporter=self.reporter)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.loop is not None:
            self.loop.begin()
            self.loop.add_batch(self._per_step)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any,
                              **kwargs: Any) -> None:
        if self.loop is not None:
            self.loop.optimizer()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loop = self.loop
        if loop is None:
            return
        loop.end(state.global_step)  # then data
        self._after_steps(state, control)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.loop is not None:
            self._after_steps(state, control)

    def _after_steps(self, state: Any, control: Any) -> None:
        if control.should_evaluate:
            if self.loop is not None:
                self.loop.outside()  # the save, if any, follows the evaluation (on_evaluate)
        elif control.should_save:
            self._saving(state)

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.loop is not None:
            if control.should_save:
                self._saving(state)
            else:
                self.loop.data()

    def _saving(self, state: Any) -> None:
        if self.loop is not None:
            self.loop.checkpoint()
        if state.is_world_process_zero:
            self._save_from = time.perf_counter()
            if self.reporter is not None:
                self.reporter.heartbeat("checkpoint")

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.loop is None:
            return
        self.loop.data()
        if not state.is_world_process_zero:
            return
        path = os.path.join(args.output_dir, f"{CHECKPOINT_PREFIX}-{state.global_step}")
        started, self._save_from = self._save_from, None
        write_ms = None if started is None else (time.perf_counter() - started) * 1e3
        self.loop.checkpoint_written(state.global_step, path, size_bytes=dir_size(path),
                                     write_ms=write_ms)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Training ended (an exception would not get here: the SDK's excepthook says that
        one): the rank's completion, then the reporter closes."""
        if self.loop is not None:
            self.loop.flush()
        if self.reporter is not None:
            self.reporter.leaving(0, "completed", "train ended")
            self.reporter.close()
