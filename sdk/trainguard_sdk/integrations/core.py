"""The framework-free part of the trainer integrations: which step a timing belongs to, how
many samples were consumed, how long the loop waited between steps, and what goes to the
reporter. Standard library only; the callbacks (``lightning``, ``hf``) feed it.

    loop = StepLoop(reporter, world_size)
    loop.timer = StepTimer(ddp, reporter=reporter)  # else the wall clock (WallTimer): see below
    # per batch:       loop.begin(); loop.add_batch(local_batch_size)
    # per optimizer step (after it): loop.end(global_step)
    # per checkpoint written:        loop.checkpoint_written(step, path, ...)
    # after training:                loop.flush()

Sections (the reporter's heartbeats say which part of its step a rank is in, for the
section-hang rule): ``begin()`` enters forward (every micro-batch), ``backward()``,
``optimizer()`` (after backward: clipping and the step), ``end()`` reports and enters data
(the next batch loads), ``data()`` likewise for a micro-batch, ``checkpoint()`` a save,
``outside()`` no section (evaluation, logging: nothing to judge as a step's part). The
``StepTimer`` given the reporter enters comm when this rank's last gradient bucket is ready.

``begin()`` is idempotent until ``end()``: with gradient accumulation the step's timing
covers every micro-batch of the optimizer step. ``data_wait_ms`` is the time from the last
step's end to this step's begin (data loading and the loop's own work between steps).

Timing: ``trainguard_sdk.ddp.StepTimer`` when the framework's model is a
``DistributedDataParallel`` the callback could install its communication hook on (compute =
this rank's own forward+backward, DDP's overlap kept). Otherwise ``WallTimer``: compute is
the whole step, no comm figure, so in a DDP job a fast rank waiting for a straggler looks as
slow as it (the straggler rule then cannot tell them apart; the step and liveness reports
still hold). On CUDA ``StepTimer`` returns the previous step's figures: each figure carries
the index of the step it belongs to, and ``StepLoop`` reports it under that step's number, with
that step's samples, data wait and loss; ``flush()`` reports the last one after training.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from trainguard_sdk.identity import Identity, identity_from_env
from trainguard_sdk.wire import Section

Clock = Callable[[], int]  # nanoseconds, monotonic


class Timing(Protocol):
    @property
    def index(self) -> int: ...
    @property
    def compute_ms(self) -> float: ...
    @property
    def comm_ms(self) -> float: ...
    @property
    def step_ms(self) -> float: ...


class Timer(Protocol):
    def start(self) -> None: ...
    def stop(self) -> Timing | None: ...


class Sink(Protocol):
    """What ``StepLoop`` sends to: a ``StepReporter``."""

    def step(self, step: int, samples_consumed: int, compute_ms: float,
             comm_ms: float | None = None, data_wait_ms: float | None = None,
             step_ms: float | None = None, loss: float | None = None,
             shard_offset: int | None = None) -> bool: ...

    def heartbeat(self, phase: str = "step") -> bool: ...

    def section(self, section: Section) -> None: ...

    def end_section(self) -> None: ...

    def checkpoint(self, action: str, step: int, samples_consumed: int, path: str, *,
                   sha256: str | None = None, size_bytes: int | None = None,
                   write_ms: float | None = None, reason: str | None = None) -> bool: ...


@dataclass(frozen=True)
class WallTiming:
    index: int
    compute_ms: float
    step_ms: float
    comm_ms: float = 0.0  # unknown: reported as absent (see ``StepLoop.end``)


class WallTimer:
    """The fallback: the whole step on the monotonic clock (no DDP hook)."""

    has_comm = False

    def __init__(self, clock: Clock = time.perf_counter_ns) -> None:
        self._clock = clock
        self.index = -1
        self._start = 0

    def start(self) -> None:
        self.index += 1
        self._start = self._clock()

    def stop(self) -> WallTiming | None:
        if self.index < 0:
            return None
        ms = (self._clock() - self._start) / 1e6
        return WallTiming(self.index, ms, ms)


@dataclass(frozen=True)
class _Pending:
    step: int
    samples: int
    data_wait_ms: float | None
    loss: float | None


class StepLoop:
    def __init__(self, sink: Sink, world_size: int, *, clock: Clock = time.perf_counter_ns,
                 samples: int = 0) -> None:
        self.sink = sink
        self.world_size = world_size
        self.timer: Timer = WallTimer(clock)
        self.samples = samples  # consumed by the whole job so far
        self._clock = clock
        self._running = False
        self._index = -1  # starts of the timer
        self._wait_ms: float | None = None
        self._last_end: int | None = None
        self._pending: dict[int, _Pending] = {}
        self.last_step: int | None = None  # the last step ended

    @property
    def running(self) -> bool:
        return self._running

    def begin(self) -> None:
        """A batch begins (forward): starts the step's timing unless a step is already
        running (gradient accumulation's micro-batches)."""
        self.sink.section(Section.FORWARD)
        if self._running:
            return
        now = self._clock()
        self._wait_ms = None if self._last_end is None else (now - self._last_end) / 1e6
        self._running = True
        self._index += 1
        self.timer.start()

    def add_batch(self, local_samples: int | None) -> None:
        """This rank's batch of ``local_samples``; the job consumed ``world_size`` times it."""
        if local_samples:
            self.samples += local_samples * self.world_size

    def backward(self) -> None:
        self.sink.section(Section.BACKWARD)

    def optimizer(self) -> None:
        """Backward is done: what follows until the step ends is the optimizer's."""
        self.sink.section(Section.OPTIMIZER)

    def data(self) -> None:
        """The next batch loads."""
        self.sink.section(Section.DATA)

    def checkpoint(self) -> None:
        self.sink.section(Section.CHECKPOINT)

    def outside(self) -> None:
        """Outside the steps (evaluation, logging): no section."""
        self.sink.end_section()

    def end(self, step: int, loss: float | None = None) -> bool:
        """The optimizer step ``step`` is done: report it (or, on CUDA, the one before), then
        enter data. True if a report went out."""
        if not self._running:
            return False
        self._running = False
        self.last_step = step
        self._pending[self._index] = _Pending(step, self.samples, self._wait_ms, loss)
        timing = self.timer.stop()
        self._last_end = self._clock()
        sent = self._report(timing)
        self.sink.section(Section.DATA)
        return sent

    def flush(self) -> bool:
        """After training: report the step whose figures the timer still holds (``StepTimer``
        on CUDA: waits for its events, once). True if a report went out."""
        flush = getattr(self.timer, "flush", None)
        if self._running or flush is None:
            return False
        return self._report(flush())

    def _report(self, timing: Timing | None) -> bool:
        if timing is None:
            self._forget_before(self._index - 1)
            return False
        pending = self._pending.get(timing.index)
        self._forget_before(timing.index + 1)
        if pending is None:
            return False
        comm = timing.comm_ms if getattr(self.timer, "has_comm", True) else None
        return self.sink.step(pending.step, pending.samples, timing.compute_ms, comm_ms=comm,
                              data_wait_ms=pending.data_wait_ms, step_ms=timing.step_ms,
                              loss=pending.loss)

    def checkpoint_written(self, step: int, path: str, *, size_bytes: int | None = None,
                           write_ms: float | None = None) -> bool:
        return self.sink.checkpoint("written", step, self.samples, path, size_bytes=size_bytes,
                                    write_ms=write_ms)

    def _forget_before(self, index: int) -> None:
        for old in [i for i in self._pending if i < index]:
            del self._pending[old]


def resolve_identity(framework_rank: int, framework_world: int,
                     env: Mapping[str, str] | None = None, **kwargs: object) -> Identity:
    """The identity from the launcher (``identity_from_env``); where no launcher variable
    names the rank (a framework's own launcher that sets only LOCAL_RANK, say) but the
    framework runs more than one process, its rank and world size are used instead."""
    env = os.environ if env is None else env
    # which launcher, before the layout (which a single process's world of 1 would not fit)
    probe = {k: v for k, v in kwargs.items() if k != "layout"}
    if (identity_from_env(env, **probe).launcher == "single"  # type: ignore[arg-type]
            and framework_world > 1):
        return identity_from_env(env, rank=framework_rank, world_size=framework_world,
                                 **kwargs)  # type: ignore[arg-type]
    return identity_from_env(env, **kwargs)  # type: ignore[arg-type]


def batch_size(batch: object) -> int | None:
    """The number of samples in a batch: a tensor's (or array's) first dimension, or that of
    the first one inside a list, tuple or mapping; None when there is none."""
    shape = getattr(batch, "shape", None)
    if shape is not None:
        try:
            return int(shape[0]) if len(shape) else None
        except (TypeError, ValueError, IndexError):
            return None
    if isinstance(batch, Mapping):
        items: list[object] = list(batch.values())
    elif isinstance(batch, (list, tuple)):
        items = list(batch)
    else:
        return None
    for item in items:
        n = batch_size(item)
        if n is not None:
            return n
    return None


def dir_size(path: str) -> int | None:
    """Bytes under ``path`` (a file or a directory); None if it is missing or unreadable."""
    if not os.path.exists(path):
        return None
    try:
        if os.path.isfile(path):
            return os.path.getsize(path)
        total = 0
        for root, _dirs, files in os.walk(path):
            for name in files:
                total += os.path.getsize(os.path.join(root, name))
        return total
    except OSError:
        return None
