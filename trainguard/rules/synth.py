"""Event builders for tests, benchmarks and drills: deterministic ids, no clock."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence

from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    DepartureCause,
    GpuSample,
    Heartbeat,
    NicSample,
    NodeHealth,
    NodeHealthKind,
    NodeTelemetry,
    PoolUnit,
    ProcessExit,
    ProcessSample,
    Section,
    StepReport,
    UnitState,
)

SRC = "synth"


def step_report(job: str, rank: int, step: int, t: int, compute_ms: float, *,
                world: int = 8, pp_stage: int | None = None, node: str | None = None,
                loss: float | None = None, data_wait_ms: float | None = None,
                step_ms: float | None = None, epoch: int = 0, pid: int | None = None) -> Event:
    payload = StepReport(rank=rank, world_size=world, pp_stage=pp_stage, step=step,
                         samples_consumed=step * 32, compute_ms=compute_ms, loss=loss,
                         data_wait_ms=data_wait_ms, step_ms=step_ms, binding_epoch=epoch,
                         pid=pid)
    return make_event(payload, event_id=derived_id("synth-step", job, rank, step, t,
                                                   *((epoch,) if epoch else ())),
                      job_id=job, event_time=t, source=SRC,
                      subject=Subject(rank=rank, node=node or f"node-{rank // 8}"))


def heartbeat(job: str, rank: int, t: int, epoch: int = 0) -> Event:
    return make_event(Heartbeat(rank=rank, binding_epoch=epoch),
                      event_id=derived_id("synth-hb", job, rank, t, *((epoch,) if epoch else ())),
                      job_id=job, event_time=t, source=SRC, subject=Subject(rank=rank))


def section_heartbeat(job: str, rank: int, t: int, section: Section | None, start: int | None,
                      *, step: int | None = None, epoch: int = 0) -> Event:
    """A v2 heartbeat: ``rank`` in ``section`` since ``start`` (None: in no section)."""
    return make_event(Heartbeat(rank=rank, binding_epoch=epoch, step=step, section=section,
                                section_start=start),
                      event_id=derived_id("synth-shb", job, rank, t, epoch),
                      job_id=job, event_time=t, source=SRC, subject=Subject(rank=rank))


def process_exit(job: str, node: str, rank: int, t: int, exit_code: int | None = 1,
                 signal: int | None = None, *, epoch: int | None = None,
                 pid: int | None = None,
                 said: tuple[int, DepartureCause, str | None] | None = None) -> Event:
    """``said``: what the rank declared before it ended (code, cause, reason)."""
    payload = ProcessExit(pid=pid or 1000 + rank, rank=rank, exit_code=exit_code, signal=signal,
                          binding_epoch=epoch,
                          declared_code=None if said is None else said[0],
                          declared_cause=None if said is None else said[1],
                          declared_reason=None if said is None else said[2])
    return make_event(payload, event_id=derived_id("synth-exit", job, rank, t), job_id=job,
                      event_time=t, source=SRC, subject=Subject(node=node, rank=rank))


def bound(job: str, rank: int, epoch: int, t: int, *, pid: int | None = None,
          unit: str | None = None) -> Event:
    """The actuator's ``pool.unit`` ``bound`` event (unsigned here: the engine is fed only
    verified ones, so tests hand them in directly)."""
    name = unit or f"u{rank}-e{epoch}"
    payload = PoolUnit(unit=name, state=UnitState.BOUND, rank=rank, epoch=epoch, pid=pid)
    return make_event(payload, event_id=derived_id("synth-bound", job, rank, epoch, t),
                      job_id=job, event_time=t, source=SRC, subject=Subject(unit=name,
                                                                            rank=rank))


def checkpoint(job: str, action: CheckpointAction, step: int, t: int,
               path: str = "/ckpt/step") -> Event:
    payload = CheckpointEvent(action=action, step=step, samples_consumed=step * 32,
                              path=f"{path}-{step}")
    return make_event(payload, event_id=derived_id("synth-ckpt", job, action.value, step, t),
                      job_id=job, event_time=t, source=SRC)


def node_health(job: str, node: str, kind: NodeHealthKind, t: int, *, code: int | None = None,
                device: str | None = None, gpu: int | None = None) -> Event:
    payload = NodeHealth(kind=kind, code=code, device=device)
    return make_event(payload, event_id=derived_id("synth-health", job, node, kind.value, t,
                                                   code, device, gpu),
                      job_id=job, event_time=t, source=SRC, subject=Subject(node=node, gpu=gpu))


def telemetry(job: str, node: str, t: int, seq: int, gpus: Sequence[GpuSample] = (),
              nics: Sequence[NicSample] = (),
              processes: Sequence[ProcessSample] = ()) -> Event:
    payload = NodeTelemetry(interval_ms=1000.0, seq=seq, gpus=list(gpus), nics=list(nics),
                            processes=list(processes))
    return make_event(payload, event_id=derived_id("synth-tel", job, node, seq), job_id=job,
                      event_time=t, source=SRC, subject=Subject(node=node))


def gpu(index: int, *, temp: float = 65.0, power: float = 400.0, clock: float = 1980.0,
        util: float = 95.0, **kw: object) -> GpuSample:
    return GpuSample.model_validate({"index": index, "temperature_c": temp, "power_w": power,
                                     "sm_clock_mhz": clock, "sm_util_pct": util, **kw})


def job_steps(job: str, ranks: int, steps: int, *, base_ms: float = 100.0,
              noise: float = 0.0, seed: int = 0, slow: dict[int, tuple[int, float]] | None = None,
              step_us: int = 200_000, start_us: int = 1_700_000_000_000_000,
              stages: int = 1, first_step: int = 0, epoch: int = 0,
              pids: dict[int, int] | None = None) -> Iterator[Event]:
    """A synchronous job: every rank reports every step. ``slow``: rank -> (from step, factor);
    ``noise``: uniform relative noise (0.1 = +-10%)."""
    rng = random.Random(seed)
    slow = slow or {}
    per_stage = max(ranks // stages, 1)
    for step in range(first_step, first_step + steps):
        for rank in range(ranks):
            factor = 1.0
            if rank in slow and step >= slow[rank][0]:
                factor = slow[rank][1]
            ms = base_ms * factor * (1.0 + rng.uniform(-noise, noise))
            t = start_us + (step - first_step) * step_us + rank * 10
            yield step_report(job, rank, step, t, ms, world=ranks,
                              pp_stage=(rank // per_stage) if stages > 1 else None,
                              epoch=epoch, pid=(pids or {}).get(rank))
