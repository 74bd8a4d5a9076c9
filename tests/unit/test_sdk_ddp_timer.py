"""StepTimer (trainguard_sdk.ddp) on a one-rank gloo DDP in this process: the hook sees every
bucket, wraps the user's hook, splits the step; the CUDA path (events read one step late,
never waited for) with stand-in events, since this machine has no GPU."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel
from trainguard_sdk.ddp import StepTimer


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One gloo group for the module: a group destroyed and made again per test left gloo's
    threads of the old one racing the new one's first collective (an abort, under load)."""
    path = tmp_path_factory.mktemp("ddp") / "store"
    store = dist.FileStore(str(path), 1)  # type: ignore[attr-defined]
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _model(sleep_s: float = 0.0) -> nn.Module:
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 2))
    if sleep_s:
        m.register_forward_pre_hook(lambda _m, _i: time.sleep(sleep_s))
    return m


def _step(ddp: DistributedDataParallel, timer: StepTimer) -> None:
    timer.start()
    ddp(torch.ones(4, 8)).sum().backward()


def test_cpu_step_is_split_at_the_last_bucket(group: None) -> None:
    ddp = DistributedDataParallel(_model(sleep_s=0.03), bucket_cap_mb=0.001)
    timer = StepTimer(ddp)
    assert not timer.cuda and timer.stop() is None  # nothing started
    for _ in range(3):
        _step(ddp, timer)
        t = timer.stop()
    assert t is not None
    assert t.index == 2 and t.buckets >= 2  # rebuilt buckets after the first step
    assert t.compute_ms >= 30.0  # the sleep in forward is this rank's compute
    assert t.comm_ms >= 0.0 and t.compute_ms + t.comm_ms <= t.step_ms
    assert 0.0 <= t.bucket_spread_ms <= t.compute_ms


def test_a_users_hook_is_wrapped_and_gradients_are_unchanged(group: None) -> None:
    calls: list[int] = []

    def mine(state: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        calls.append(bucket.index())
        return default_hooks.allreduce_hook(state, bucket)

    plain = DistributedDataParallel(_model())
    plain(torch.ones(4, 8)).sum().backward()
    for hook in (mine, None):  # the user's hook, and the timer's own inlined all-reduce
        hooked = DistributedDataParallel(_model())
        timer = StepTimer(hooked, hook=hook)
        _step(hooked, timer)
        assert timer.stop() is not None
        for a, b in zip(plain.parameters(), hooked.parameters(), strict=True):
            assert a.grad is not None and b.grad is not None and torch.equal(a.grad, b.grad)
    assert calls


class FakeEvent:
    """A stand-in for torch.cuda.Event: a record takes the next tick of a fake device clock."""

    clock = 0.0
    complete = True

    def __init__(self, enable_timing: bool = False) -> None:
        self.at: float | None = None

    def record(self, stream: Any = None) -> None:
        FakeEvent.clock += 1.0
        self.at = FakeEvent.clock

    def query(self) -> bool:
        return FakeEvent.complete

    def synchronize(self) -> None:
        assert self.at is not None

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None
        return end.at - self.at


def test_cuda_figures_come_one_step_late_and_never_wait(
        group: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    ddp = DistributedDataParallel(_model(), bucket_cap_mb=0.001)
    timer = StepTimer(ddp, cuda=True)
    _step(ddp, timer)
    assert timer.stop() is None  # step 0's events are read at step 1
    _step(ddp, timer)
    t = timer.stop()
    assert t is not None and t.index == 0 and t.buckets >= 1
    # ticks: start, then per bucket (first on the first), last, done; then end
    assert t.compute_ms >= 1.0 and t.comm_ms >= 1.0 and t.step_ms > t.compute_ms + t.comm_ms - 1
    FakeEvent.complete = False
    try:
        _step(ddp, timer)
        assert timer.stop() is None and timer.skipped == 1  # not complete: skipped, no sync
    finally:
        FakeEvent.complete = True
    _step(ddp, timer)
    t = timer.stop()
    assert t is not None and t.index == 2


def test_the_exchange_runs_over_ddps_own_process_group(
        group: None, monkeypatch: pytest.MonkeyPatch) -> None:
    sub = dist.new_group([0])  # a data-parallel group, as in a 3D layout
    seen: list[Any] = []
    real = dist.all_reduce

    def spy(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("group"))
        return real(tensor, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", spy)
    ddp = DistributedDataParallel(_model(), process_group=sub)
    timer = StepTimer(ddp)
    _step(ddp, timer)
    assert timer.stop() is not None
    assert seen and all(g is sub for g in seen)


def test_the_integrations_install_the_timer_on_ddp_else_fall_back_to_the_wall_clock(
        group: None, caplog: pytest.LogCaptureFixture) -> None:
    from trainguard_sdk.integrations._torch import timer_for
    from trainguard_sdk.integrations.core import WallTimer

    ddp = DistributedDataParallel(_model())
    timer, how = timer_for(ddp)
    assert isinstance(timer, StepTimer) and how == "ddp-hook"
    again, how = timer_for(ddp)  # the comm hook is taken (by the first timer): fall back
    assert isinstance(again, WallTimer) and "could not be installed" in how
    plain, how = timer_for(_model())
    assert isinstance(plain, WallTimer) and "not DistributedDataParallel" in how
    assert sum("step timing from the wall clock" in r.getMessage()
               for r in caplog.records) == 2


def test_the_layout_from_a_device_mesh_and_from_process_groups(group: None) -> None:
    """Layout.from_mesh / from_groups on torch's own objects (one gloo rank: a 1x1x1 mesh)."""
    from torch.distributed.device_mesh import init_device_mesh
    from trainguard_sdk import Layout, identity_from_env

    mesh = init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=("dp", "pp", "tp"))
    from_mesh = Layout.from_mesh(mesh)
    assert (from_mesh.tp, from_mesh.pp, from_mesh.dp(1)) == (1, 1, 1)
    from_groups = Layout.from_groups(tp=mesh.get_group("tp"), pp=mesh.get_group("pp"))
    assert (from_groups.tp, from_groups.pp) == (1, 1)
    env = {"TRAINGUARD_JOB_ID": "j", "RANK": "0", "WORLD_SIZE": "1"}
    for layout in (from_mesh, from_groups):
        ident = identity_from_env(env, layout=layout)
        assert (ident.dp_rank, ident.pp_stage, ident.tp_rank,
                ident.dp_size, ident.pp_size, ident.tp_size) == (0, 0, 0, 1, 1, 1)


class StepSink:
    """Records what a loop reports: (step, samples, loss)."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, int, float | None]] = []

    def step(self, step: int, samples_consumed: int, compute_ms: float,
             comm_ms: float | None = None, data_wait_ms: float | None = None,
             step_ms: float | None = None, loss: float | None = None,
             shard_offset: int | None = None) -> bool:
        assert compute_ms >= 1.0 and comm_ms is not None  # the timer's figures, not the wall's
        self.steps.append((step, samples_consumed, loss))
        return True

    def section(self, section: Any) -> None:
        pass

    def end_section(self) -> None:
        pass

    def heartbeat(self, phase: str = "step") -> bool:
        return True

    def checkpoint(self, action: str, step: int, samples_consumed: int, path: str, *,
                   sha256: str | None = None, size_bytes: int | None = None,
                   write_ms: float | None = None, reason: str | None = None) -> bool:
        return True


def test_cuda_figures_are_reported_under_their_own_step_by_the_reference_workload(
        group: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """trainguard.workload.ddp's loop: the figures a stop() returns belong to the previous
    step on CUDA, and go out under that step's number with that step's own position and loss;
    a step whose events were not complete is not reported; the last one comes at flush()."""
    from trainguard.workload.ddp import StepFigures, StepLabels

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    ddp = DistributedDataParallel(_model(), bucket_cap_mb=0.001)
    timer, labels, sink = StepTimer(ddp, cuda=True), StepLabels(), StepSink()
    reported = []
    for step in range(11, 16):  # resumed at step 10
        _step(ddp, timer)
        FakeEvent.complete = step != 13  # step 12's events are not complete when read at 13
        try:
            timing = timer.stop()
        finally:
            FakeEvent.complete = True
        figures = StepFigures(step, step * 8, data_wait_ms=0.5, step_ms=9.0, loss=step / 10)
        reported.append(labels.report(sink, timer.index, figures, timing))
    reported.append(labels.report(sink, timer.index, None, timer.flush()))
    assert reported == [None, 11, None, 13, 14, 15]
    assert sink.steps == [(s, s * 8, s / 10) for s in (11, 13, 14, 15)]
    assert timer.flush() is None and timer.skipped == 1  # flushed once; 12 skipped


def test_cuda_figures_are_reported_under_their_own_step_by_the_step_loop(
        group: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """StepLoop (examples/torchrun_train.py and the Lightning / HF callbacks) on the CUDA
    path: every step under its own number, the last one at flush()."""
    from trainguard_sdk.integrations.core import StepLoop

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    ddp = DistributedDataParallel(_model(), bucket_cap_mb=0.001)
    sink = StepSink()
    loop = StepLoop(sink, world_size=2, samples=4 * 32 * 2)  # resumed after step 4
    loop.timer = StepTimer(ddp, cuda=True)
    sent = []
    for step in (5, 6, 7):
        loop.begin()
        loop.add_batch(32)
        ddp(torch.ones(4, 8)).sum().backward()
        sent.append(loop.end(step, loss=float(step)))
    assert sent == [False, True, True]
    assert loop.flush() and not loop.flush()
    assert sink.steps == [(5, 320, 5.0), (6, 384, 6.0), (7, 448, 7.0)]
