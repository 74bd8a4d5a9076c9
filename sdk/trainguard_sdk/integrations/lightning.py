"""PyTorch Lightning (package ``lightning``): ``TrainguardCallback``.

    from trainguard_sdk.integrations.lightning import TrainguardCallback

    trainer = L.Trainer(strategy="ddp", callbacks=[TrainguardCallback()])

What it does, per rank:

- identity from the launcher (``identity_from_env``: torchrun, Slurm, trainguard's actuator;
  under Lightning's own launcher, which names no global rank, the trainer's rank and world
  size); a ``StepReporter`` to the node agent, whose daemon thread heartbeats;
- a step report after every optimizer step (``trainer.global_step``), with this rank's compute
  timed by ``trainguard_sdk.ddp.StepTimer``: at ``on_fit_start`` its communication hook is
  installed on the strategy's ``DistributedDataParallel`` model, so DDP's overlap is kept.
  Where that cannot be done (not a DDP strategy, or a ``ddp_comm_hook`` already given to the
  strategy: pass it to this callback as ``hook=``/``state=`` instead) the step is timed by the
  wall clock (``timing`` says which, with the reason, and a warning is logged once);
- a ``checkpoint`` record ("written", with path, size and write time) for every file the
  strategy's ``CheckpointIO`` writes (ModelCheckpoint, ``trainer.save_checkpoint``): the
  callback wraps ``trainer.strategy.checkpoint_io``; the writing rank sends it and
  heartbeats phase "checkpoint" while it writes;
- sections for the section-hang rule: forward from ``on_train_batch_start``, backward from
  ``on_before_backward``, optimizer from ``on_after_backward`` / ``on_before_optimizer_step``,
  comm at this rank's last gradient bucket (the ``StepTimer``), data from
  ``on_train_batch_end`` (the next batch loads), checkpoint from ``on_save_checkpoint`` (every
  rank: the others wait for the writer) until the writer's file is written (the other ranks
  stay in it until their next batch starts), none during validation;
- the layout (dp/pp/tp) given as ``layout=`` (``Layout(...)``, ``Layout.from_mesh(...)``);
- the reporter closes at ``teardown`` (after the last step's figures, which on CUDA come one
  step late, and a last "idle" heartbeat), saying the rank completed (``leaving(0,
  "completed")``) unless ``on_exception`` said why it is leaving (Lightning tears down before
  the exception leaves ``fit``, so the SDK's excepthook would find the reporter closed).

``report_loss=True`` adds the step's loss (``loss.item()``: a device synchronisation per step
on GPUs, so off by default). The lazy import: ``import trainguard_sdk`` never imports
Lightning; this module does.
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.fabric.plugins import CheckpointIO

from trainguard_sdk.identity import Identity, Layout
from trainguard_sdk.integrations._torch import timer_for
from trainguard_sdk.integrations.core import StepLoop, batch_size, dir_size, resolve_identity


class _ReportingCheckpointIO(CheckpointIO):
    """The strategy's CheckpointIO, reporting each file it writes."""

    def __init__(self, inner: CheckpointIO, callback: TrainguardCallback) -> None:
        self.inner = inner
        self.callback = callback

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        self.callback._saving()
        started = time.perf_counter()
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        self.callback._saved(int(checkpoint.get("global_step", 0)), str(path),
                             (time.perf_counter() - started) * 1e3)

    def load_checkpoint(self, path: Any, map_location: Any | None = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        return self.inner.load_checkpoint(path, map_location=map_location,
                                          weights_only=weights_only)

    def remove_checkpoint(self, path: Any) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()


class TrainguardCallback(pl.Callback):
    def __init__(self, *, job_id: str | None = None, hook: Any = None, state: Any = None,
                 report_loss: bool = False, reporter: Any = None,
                 layout: Layout | None = None, **reporter_kwargs: Any) -> None:
        """``job_id``: else from the launcher. ``hook``/``state``: your DDP communication
        hook (wrapped by the timer). ``reporter``: a ready ``StepReporter`` (else one is made
        for this rank's identity, with ``reporter_kwargs``). ``layout``: the parallel
        layout (default: data-parallel only)."""
        self.job_id = job_id
        self.layout = layout
        self.hook, self.hook_state = hook, state
        self.report_loss = report_loss
        self.reporter: Any = reporter
        self.reporter_kwargs = reporter_kwargs
        self.identity: Identity | None = None
        self.loop: StepLoop | None = None
        self.timing = "not started"
        self.failed = False

    # -- setup and teardown ------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.loop is not None:
            return
        self.identity = resolve_identity(trainer.global_rank, trainer.world_size,
                                         job_id=self.job_id, layout=self.layout)
        if self.reporter is None:
            self.reporter = self.identity.reporter(**self.reporter_kwargs)
        self.loop = StepLoop(self.reporter, self.identity.world_size)
        io = trainer.strategy.checkpoint_io
        if not isinstance(io, _ReportingCheckpointIO):
            trainer.strategy.checkpoint_io = _ReportingCheckpointIO(io, self)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.loop is not None:
            # the step already done (resumed): a micro-batch of the first optimizer step
            # ends with this global step, and is not a step of its own
            self.loop.last_step = trainer.global_step
            self.loop.timer, self.timing = timer_for(trainer.strategy.model, hook=self.hook,
                                                     state=self.hook_state,
                                                     reporter=self.reporter)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        """Lightning tears down (closing the reporter) before the exception leaves ``fit``:
        say the rank's departure now, while the reporter is open."""
        self.failed = True
        if self.reporter is not None:
            self.reporter.departing(exception)

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """The reporter closes here; a stage that ended without an exception is the rank's
        completion (its exit, later, is no fault even where its status cannot be read)."""
        if self.loop is not None:
            self.loop.flush()
        if self.reporter is not None:
            if not self.failed:
                self.reporter.leaving(0, "completed", f"{stage} ended")
            self.reporter.close()

    # -- steps --------------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.loop is not None:
            self.loop.begin()
            self.loop.add_batch(batch_size(batch))

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: Any) -> None:
        if self.loop is not None:
            self.loop.backward()

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.loop is not None:
            self.loop.optimizer()

    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: Any) -> None:
        if self.loop is not None:
            self.loop.optimizer()

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        loop = self.loop
        if loop is None:
            return
        if not loop.running or trainer.global_step == loop.last_step:
            loop.data()  # a micro-batch of gradient accumulation: the step goes on
            return
        loss = None
        if self.report_loss:
            value = outputs.get("loss") if isinstance(outputs, dict) else outputs
            loss = float(value) if value is not None else None
        loop.end(trainer.global_step, loss=loss)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.loop is not None:
            self.loop.outside()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.loop is not None:
            self.loop.data()

    # -- checkpoints ---------------------------------------------------------------------------

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if self.loop is not None:  # every rank: the state is gathered, then written by one
            self.loop.checkpoint()

    # called by _ReportingCheckpointIO on the writing rank

    def _saving(self) -> None:
        if self.loop is not None:
            self.loop.checkpoint()
        if self.reporter is not None:
            self.reporter.heartbeat("checkpoint")

    def _saved(self, step: int, path: str, write_ms: float) -> None:
        if self.loop is not None:
            self.loop.checkpoint_written(step, path, size_bytes=dir_size(path),
                                         write_ms=write_ms)
            self.loop.data()
