"""Per-rank compute time with DDP's overlap of backward and gradient exchange kept.

Inside DDP's overlapped backward, a fast rank's step time includes waiting in the all-reduce
for the slowest rank, so every rank looks as slow as the straggler. ``StepTimer`` registers a
DDP communication hook (wrapping DDP's default all-reduce, or the hook you pass) that notes
when each gradient bucket became ready on this rank and when its exchange completed:

    compute_ms = step start -> this rank's last bucket ready   (its own forward + backward)
    comm_ms    = last bucket ready -> last bucket exchanged    (waiting for peers + transfer)
    step_ms    = step start -> ``stop()``                      (the rest: optimizer, ...)

    ddp = DistributedDataParallel(model)
    timer = StepTimer(ddp)                 # instead of ddp.register_comm_hook(...)
    for batch in loader:
        timer.start()                      # the step begins (after the batch is loaded)
        loss_fn(ddp(x), y).backward(); optimizer.step()
        t = timer.stop()                   # StepTiming, or None (see CUDA below)
        if t is not None:                  # t.index: the start() it belongs to (CUDA: lags)
            done = first_step + t.index
            reporter.step(done, samples_at(done), t.compute_ms, comm_ms=t.comm_ms,
                          step_ms=t.step_ms)

On CPU the times come from the monotonic clock (``time.perf_counter_ns``) read in the hook and
in the exchange's completion callback. On CUDA the hook records CUDA events on the current
stream instead (the host runs ahead of the device: a host clock read in the hook says when the
kernel was queued, not when the gradient was computed), and ``stop()`` returns the *previous*
step's figures, read from events that step recorded; it never synchronises: when those events
have not completed yet, that step is skipped (``skipped`` counts them). ``StepTiming.index``
says which step the figures belong to: report them under that step's number (or let
``trainguard_sdk.integrations.core.StepLoop`` do it); after the loop, ``flush()`` gives the
last step's (one synchronisation). Events are allocated
once (two sets, alternating), and re-recorded every bucket, so the last record is the last
bucket's.

A step without a bucket (``no_sync`` micro-steps of gradient accumulation) has no exchange:
call ``stop()`` after the step that synchronises, and its compute covers the micro-steps.
Limits: a module with buffers broadcasts them at the start of each forward
(``broadcast_buffers=True``), a collective that a fast rank waits in, and that this timer
counts as compute; pass ``broadcast_buffers=False`` where the buffers need no broadcast.

``StepTimer(ddp, reporter=tg)`` also tells the reporter's heartbeats when this rank waits in
the exchange: when its last bucket is ready (``bucket.is_last()``), the rank enters
``Section.COMM`` (until the loop's next ``section()`` or ``step()``), so a hang rule can tell a
rank waiting for a stuck peer from the peer itself. On CUDA that is when the host queued the
last bucket's exchange (the host's view, like every section).

No ``from __future__ import annotations`` here: DDP checks the hook's annotations at runtime
(``bucket: dist.GradBucket``), so they must be real objects, not strings.
"""

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket  # torch.distributed.GradBucket (typed here)
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from trainguard_sdk.reporter import StepReporter
from trainguard_sdk.wire import Section

_now = time.perf_counter_ns
Hook = Callable[[Any, GradBucket], "torch.futures.Future[torch.Tensor]"]


@dataclass(frozen=True)
class StepTiming:
    index: int  # which ``start()`` these figures belong to (0 = the first)
    compute_ms: float
    comm_ms: float
    step_ms: float
    buckets: int  # gradient buckets exchanged in the step
    bucket_spread_ms: float  # first bucket ready -> last bucket ready (the overlap window)


class _Marks:
    """One step's host-clock marks (ns); CPU."""

    __slots__ = ("buckets", "done", "first", "last", "start")

    def __init__(self) -> None:
        self.start = 0
        self.first = 0
        self.last = 0
        self.done = 0
        self.buckets = 0


class _Events:
    """One step's CUDA events (allocated once, re-recorded)."""

    def __init__(self) -> None:
        ev = torch.cuda.Event
        self.start, self.first, self.last = ev(True), ev(True), ev(True)  # type: ignore[no-untyped-call]
        self.done, self.end = ev(True), ev(True)  # type: ignore[no-untyped-call]
        self.buckets = 0
        self.index = -1
        self.stopped = False  # end recorded by stop()


class StepTimer:
    def __init__(self, ddp: "torch.nn.parallel.DistributedDataParallel", *,
                 hook: Optional[Hook] = None, state: Any = None,
                 cuda: Optional[bool] = None,
                 reporter: Optional[StepReporter] = None) -> None:
        """Register the timing hook on ``ddp``. ``hook``/``state``: your own communication
        hook and its state (default: DDP's all-reduce over DDP's process group, divided by
        that group's size, as DDP does without a hook). ``cuda``: time with CUDA events (default:
        when the module's parameters are on a CUDA device). ``reporter``: enters
        ``Section.COMM`` on it when this rank's last bucket is ready."""
        self._inner: Hook = hook if hook is not None else default_hooks.allreduce_hook
        self._own = hook is None  # DDP's all-reduce, over DDP's own process group
        # the default hook's state is the process group: DDP's (a data-parallel group in a
        # 3D layout), not the default group
        self._inner_state = getattr(ddp, "process_group", None) if self._own else state
        if cuda is None:
            param = next(iter(ddp.module.parameters()), None)
            cuda = param is not None and param.is_cuda
        self.cuda = cuda
        self.index = -1
        self.skipped = 0
        self._marks = _Marks()
        self._events: list[_Events] = [_Events(), _Events()] if cuda else []
        self._cur: Optional[_Events] = None
        self._world_size: Optional[int] = None
        self._reporter = reporter
        ddp.register_comm_hook(state=None, hook=self._hook)

    # -- the training loop's side ------------------------------------------------------------

    def start(self) -> None:
        self.index += 1
        if self.cuda:
            cur = self._events[self.index % 2]
            cur.index = self.index
            cur.buckets = 0
            cur.stopped = False
            cur.start.record()
            self._cur = cur
        else:
            m = self._marks
            m.start = _now()
            m.first = m.last = m.done = 0
            m.buckets = 0

    def stop(self) -> Optional[StepTiming]:
        """This step's figures (CPU), or the previous step's (CUDA; None for the first step
        or when its events are not complete yet). None before any ``start()``."""
        if self.index < 0:
            return None
        if self.cuda:
            return self._stop_cuda()
        m = self._marks
        end = _now()
        if m.buckets == 0:  # no exchange in this step
            ms = (end - m.start) / 1e6
            return StepTiming(self.index, ms, 0.0, ms, 0, 0.0)
        done = max(m.done, m.last)
        return StepTiming(self.index, (m.last - m.start) / 1e6, (done - m.last) / 1e6,
                          (end - m.start) / 1e6, m.buckets, (m.last - m.first) / 1e6)

    def _stop_cuda(self) -> Optional[StepTiming]:
        cur = self._cur
        if cur is None:
            return None
        cur.end.record()
        cur.stopped = True
        prev = self._events[(self.index - 1) % 2]
        if prev.index != self.index - 1 or prev.index < 0:
            return None
        if not prev.end.query():  # type: ignore[no-untyped-call]  # not complete: skip rather than synchronise
            self.skipped += 1
            return None
        return self._read(prev)

    def flush(self) -> Optional[StepTiming]:
        """The last step's figures, which on CUDA ``stop()`` leaves for the next step: waits
        for its events (a synchronisation: call it once, after the loop). None on CPU
        (``stop()`` gave them), before the step's ``stop()``, or when already flushed."""
        cur = self._cur
        if not self.cuda or cur is None or cur.index != self.index or not cur.stopped:
            return None
        cur.end.synchronize()
        timing = self._read(cur)
        cur.index = -1  # read: the next stop() does not read it again
        return timing

    @staticmethod
    def _read(ev: _Events) -> StepTiming:
        step = ev.start.elapsed_time(ev.end)
        if ev.buckets == 0:
            return StepTiming(ev.index, step, 0.0, step, 0, 0.0)
        compute = ev.start.elapsed_time(ev.last)
        comm = max(ev.last.elapsed_time(ev.done), 0.0)
        spread = ev.first.elapsed_time(ev.last)
        return StepTiming(ev.index, compute, comm, step, ev.buckets, spread)

    # -- DDP's side (the autograd thread, and the exchange's completion) ---------------------

    def _hook(self, _state: Any,
              bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        if self._reporter is not None and bucket.is_last():
            self._reporter.section(Section.COMM)
        if self.cuda:
            cur = self._cur
            if cur is not None:
                if cur.buckets == 0:
                    cur.first.record()
                cur.last.record()
                cur.buckets += 1
            fut = self._inner(self._inner_state, bucket)
            return fut.then(self._done_cuda)
        m = self._marks
        t = _now()
        if m.buckets == 0:
            m.first = t
        m.last = t
        m.buckets += 1
        if self._own:
            # DDP's own all-reduce, inlined: one completion callback instead of two
            buf = bucket.buffer()
            buf.div_(self._world())
            work = dist.all_reduce(buf, group=self._inner_state, async_op=True)
            return work.get_future().then(self._done_cpu_first)
        return self._inner(self._inner_state, bucket).then(self._done_cpu)

    def _world(self) -> int:
        world = self._world_size
        if world is None:
            world = self._world_size = dist.get_world_size(self._inner_state)
        return world

    def _done_cpu_first(self, fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        t = _now()
        m = self._marks
        if t > m.done:
            m.done = t
        return fut.value()[0]

    def _done_cpu(self, fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        t = _now()
        m = self._marks
        if t > m.done:
            m.done = t
        return fut.value()

    def _done_cuda(self, fut: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        # Runs once the exchange's work is queued to complete on the current stream: the event
        # marks the point the device reaches after it (the last callback's record wins).
        cur = self._cur
        if cur is not None:
            cur.done.record()
        return fut.value()
