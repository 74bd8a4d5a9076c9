"""Synthetic event logs of one drill: a job that steps, checkpoints, loses a rank and is
restarted by the loop. For evidence-check tests and examples; every knob breaks one thing a
real recovery could get wrong, so a test can show the checks notice it."""

from __future__ import annotations

from dataclasses import dataclass

from trainguard.actuators.pool import LAUNCH_EPOCH
from trainguard.drills.evidence.model import Artifacts, Baseline, CheckpointFile
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    Command,
    CommandAction,
    CommandOutcome,
    FlatMap,
    IncidentState,
    IncidentTransition,
    Injection,
    MigrateParams,
    OutcomeStatus,
    Payload,
    PoolUnit,
    ProcessExit,
    RestartData,
    StepReport,
    UnitState,
    Verdict,
    VerdictKind,
    VerdictState,
)

T0 = 1_700_000_000_000_000
STEP_US = 100_000
JOB = "synth-job"


def loss_at(rank: int, step: int) -> float:
    return 2.0 / (1.0 + 0.05 * step) + 0.01 * rank


@dataclass(frozen=True)
class Knobs:
    world: int = 2
    ckpt_every: int = 10
    steps_before: int = 25  # steps done before the fault (rank `victim` dies after it)
    steps_after: int = 20  # steps at the new epoch
    batch: int = 32  # per rank
    victim: int = 1
    # things a bad recovery does:
    resume_offset: int = 0  # new epoch starts at checkpoint step + 1 + offset
    position_offset: int = 0  # ... with its data position off by this many samples
    from_zero: bool = False  # new epoch starts at step 1
    duplicate: bool = False  # the old victim keeps reporting after the new one started
    no_fence: bool = False  # the victim's old replica is never fenced
    bind_before_fence: bool = False  # the new epoch is bound before the old one is fenced
    loss_drift: float = 0.0  # added to every loss after the resume
    drift_after: int = 0  # ... from this many steps after it on
    corrupt_newest: bool = False  # newest checkpoint reported corrupt; previous one used
    ignore_corrupt: bool = False  # ... but the job still resumed from the corrupt one
    lose_report: bool = False  # one step report of the new epoch is missing
    no_resume: bool = False  # nothing happens after the fault
    cpus_changed: bool = False  # the spare has fewer cpus than the unit it replaces
    broken_file: bool = False  # a committed checkpoint fails verification on disk
    temp_left: bool = False  # a temp file is left in the checkpoint directory
    uid_changed: bool = False
    # an elastic job: the survivors' replicas (launchers) are kept and bound at the new epoch
    # in place, their workers restarted (new pids); and one of their old workers reporting
    # after the new epoch began
    elastic: bool = False
    late_old_worker: bool = False
    # after the resume, the last two ranks are fed each other's data shards (an elastic
    # job's slots, given other group ranks by the rendezvous), saying so in ``dp_rank`` or not
    swap_shards: bool = False
    say_shard: bool = True


class _Log:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self.n = 0

    def add(self, payload: Payload, t: int, subject: Subject | None = None) -> Event:
        self.n += 1
        e = make_event(payload, event_id=f"ev{self.n:06d}", job_id=JOB, event_time=t,
                       source="synth", subject=subject)
        self.events.append(e)
        return e


def _unit(log: _Log, t: int, name: str, state: UnitState, rank: int, epoch: int, pid: int,
          cpus: int = 1, released: list[str] | None = None,
          launched: int | None = None) -> None:
    resources: FlatMap = {"cpus": list(range(cpus))}
    if launched is not None:
        resources[LAUNCH_EPOCH] = launched
    log.add(PoolUnit(unit=name, state=state, node="n", rank=rank, epoch=epoch, pid=pid,
                     resources=resources, released=released or []), t,
            Subject(node="n", unit=name, rank=rank))


def _step(log: _Log, k: Knobs, t: int, rank: int, epoch: int, step: int, pid: int,
          drift: float = 0.0, pos_off: int = 0, shard: int | None = None) -> None:
    g = k.world * k.batch
    fed = rank if shard is None else shard
    log.add(StepReport(rank=rank, world_size=k.world, binding_epoch=epoch, step=step,
                       samples_consumed=step * g + pos_off, compute_ms=5.0,
                       dp_rank=shard if k.say_shard else None,
                       loss=loss_at(fed, step) + drift, pid=pid), t, Subject(rank=rank))


def synth_drill(k: Knobs = Knobs()) -> tuple[list[Event], Baseline, Artifacts]:
    """A drill's log, the baseline run and what the runner found on disk."""
    log = _Log()
    g = k.world * k.batch
    t = T0
    old_pid = {r: 1000 + r for r in range(k.world)}
    new_pid = {r: 2000 + r for r in range(k.world)}
    units = {r: f"u{r}" for r in range(k.world)}
    for r in range(k.world):
        _unit(log, t, units[r], UnitState.BOUND, r, 1, old_pid[r])
    written: list[int] = []
    for step in range(1, k.steps_before + 1):
        t += STEP_US
        for r in range(k.world):
            _step(log, k, t + r, r, 1, step, old_pid[r])
        if step % k.ckpt_every == 0:
            log.add(CheckpointEvent(action=CheckpointAction.WRITTEN, step=step,
                                    samples_consumed=step * g, path=f"/c/step-{step}"),
                    t + 50, Subject(rank=0))
            written.append(step)
    t += STEP_US
    log.add(Injection(drill_id="d", scenario="s", fault="worker_exit", phase="start",
                      target=f"rank-{k.victim}", params={"signal": "SIGKILL"}), t,
            Subject(rank=k.victim))
    log.add(ProcessExit(pid=old_pid[k.victim], rank=k.victim, binding_epoch=1, signal=9),
            t + 1000, Subject(node="n", rank=k.victim))
    log.add(Verdict(verdict_id="v1", rule="process-exit", kind=VerdictKind.PROCESS_EXIT,
                    state=VerdictState.OPEN, severity="critical", first_anomalous_time=t,
                    decided_time=t + 2000), t + 2000, Subject(rank=k.victim))
    log.add(IncidentTransition(incident_id="i1", seq=0, to_state=IncidentState.DETECTED),
            t + 3000)
    baseline = Baseline({(r, s): loss_at(r, s) for r in range(k.world)
                         for s in range(1, k.steps_before + k.steps_after + 30)}, 100.0)
    checkpoints = tuple(CheckpointFile(s, True) for s in written)
    if k.no_resume:
        return log.events, baseline, Artifacts(checkpoints, (), {0: 1, 1: 1},
                                               {p: 0 for p in old_pid.values()})
    log.add(Command(command_id="c1", idempotency_key="k1", action=CommandAction.MIGRATE,
                    tier=2, issued_at=t + 4000, issued_by="decide",
                    params=MigrateParams(rank=k.victim, ranks=[k.victim])), t + 4000,
            Subject(rank=k.victim))
    t_fence = t + 10_000
    t_bind = t + 20_000 if not k.bind_before_fence else t + 5_000
    for r in range(k.world):
        if (k.no_fence and r == k.victim) or (k.elastic and r != k.victim):
            continue
        how = "already gone" if r == k.victim else "sigterm, confirmed dead after 12 ms"
        _unit(log, t_fence + r, units[r], UnitState.FENCED, r, 1, old_pid[r],
              released=[f"process {old_pid[r]} ({how})", f"cgroup /x/{units[r]}"])
    for r in range(k.world):
        name = "spare0" if r == k.victim else units[r]
        cpus = 2 if (k.cpus_changed and r == k.victim) else 1
        if k.elastic and r != k.victim:  # kept: the same launcher, bound at epoch 2
            _unit(log, t_bind + r, name, UnitState.BOUND, r, 2, old_pid[r], launched=1)
            continue
        _unit(log, t_bind + r, name, UnitState.BOUND, r, 2, new_pid[r], cpus=cpus)
    log.add(CommandOutcome(command_id="c1", idempotency_key="k1", action=CommandAction.MIGRATE,
                           status=OutcomeStatus.DONE,
                           data=RestartData(action=CommandAction.MIGRATE, fence_ms=12.0)),
            t + 30_000)
    t += 2_000_000
    valid = [s for s in written]
    if k.corrupt_newest and written:
        newest = written[-1]
        for r in range(k.world):
            log.add(CheckpointEvent(action=CheckpointAction.CORRUPT, step=newest,
                                    samples_consumed=newest * g, path=f"/c/step-{newest}",
                                    reason="sha256 mismatch"), t + r, Subject(rank=r))
        if not k.ignore_corrupt:
            valid = written[:-1]
        checkpoints = tuple(CheckpointFile(s, s != newest, "", quarantined=s == newest)
                            for s in written)
    ckpt = valid[-1] if valid else 0
    start = 1 if k.from_zero else ckpt + 1 + k.resume_offset
    for r in range(k.world):
        log.add(CheckpointEvent(action=CheckpointAction.LOADED, step=ckpt,
                                samples_consumed=ckpt * g, path=f"/c/step-{ckpt}"),
                t + 10 + r, Subject(rank=r))
    missing = start + 3 if k.lose_report else None
    for step in range(start, start + k.steps_after):
        t += STEP_US
        for r in range(k.world):
            if step == missing and r == 0:
                continue
            drift = k.loss_drift if step - start >= k.drift_after else 0.0
            shard = (2 * k.world - 3 - r if r >= k.world - 2 else r) if k.swap_shards else None
            _step(log, k, t + r, r, 2, step, new_pid[r], drift, k.position_offset, shard)
        if k.late_old_worker and step == start:
            survivor = (k.victim + 1) % k.world
            _step(log, k, t + 5, survivor, 1, k.steps_before + 1, old_pid[survivor] + 500)
        if k.duplicate and step < start + 3:
            _step(log, k, t + 5, k.victim, 1, k.steps_before + step - start + 1,
                  old_pid[k.victim])
        if step % k.ckpt_every == 0:
            log.add(CheckpointEvent(action=CheckpointAction.WRITTEN, step=step,
                                    samples_consumed=step * g, path=f"/c/step-{step}"),
                    t + 50, Subject(rank=0))
            checkpoints += (CheckpointFile(step, True),)
    log.add(IncidentTransition(incident_id="i1", seq=1, from_state=IncidentState.DETECTED,
                               to_state=IncidentState.RECOVERED), t + 1000)
    if k.broken_file and checkpoints:
        c = checkpoints[-1]
        checkpoints = (*checkpoints[:-1], CheckpointFile(c.step, False, "sha256 mismatch"))
    uids = {p: 0 for p in [*old_pid.values(), *new_pid.values()]}
    if k.uid_changed:
        uids[new_pid[k.victim]] = 1000
    return log.events, baseline, Artifacts(
        checkpoints, ("step-x/.tmp-state.pt",) if k.temp_left else (),
        {r: 1 for r in range(k.world)}, uids)
