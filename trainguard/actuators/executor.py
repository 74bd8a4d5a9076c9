"""Carrying out one trusted command on one job through a backend, recording every step.

Synchronous and free of Kafka: every event (``pool.unit``, ``replica.refused``) goes to
``emit``; the pool state is folded from the very events emitted, so what is on the log is what
the actuator believes. The service (``service.py``) verifies commands before they get here.

A process group of a synchronous job (DDP/gloo, the toy job) cannot take one new rank into a
running group: its survivors exit when a peer dies. So ``migrate`` and ``resume`` both restart
the whole group from the last valid checkpoint: every bound replica is fenced (stopped,
confirmed dead, unit released) *before* any replica is launched, then every rank is launched at
a new epoch (job epoch + 1) — ``migrate`` with every failed rank (``params.ranks``) on a
spare of its own outside the failure domains that just failed
(``params.avoid_domains``), the others on their own units; ``resume`` in place. A migrated
rank's old unit stays ``fenced`` (quarantined, never rebound) until an operator returns it. No
spare for one of the failed ranks -> the command fails before anything is fenced (nothing is
shrunk or half moved) and the policy escalates. A unit that is to run a rank and cannot reach
the job's checkpoint storage fails the command the same way, but marked retryable
(``RestartData.retry``): the storage may come back, and the policy retries with backoff.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Literal

from trainguard.actuators import cgroups
from trainguard.actuators.backend import Backend, Replica
from trainguard.actuators.fencing import FenceError, is_replica_of, is_stale, kill_now
from trainguard.actuators.jobspec import JobSpec, JobSpecError
from trainguard.actuators.pool import (
    PoolState,
    Unit,
    choose_spares,
    domains,
    format_domains,
    parse_domains,
    reduce,
)
from trainguard.dev.kafka import free_port
from trainguard.events.clock import now_us
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id, new_event_id
from trainguard.events.payloads import (
    ActionData,
    CheckpointNowData,
    Command,
    CommandAction,
    EscalateData,
    FenceData,
    FlatMap,
    Heartbeat,
    MigrateParams,
    OutcomeStatus,
    PoolUnit,
    RaiseQuotaData,
    RaiseQuotaParams,
    ReplicaRefused,
    RestartData,
    RetryCondition,
    StepReport,
    UnitState,
)

Emit = Callable[[Event], None]
SOURCE = "trainguard-actuator"


@dataclass
class Result:
    status: OutcomeStatus
    detail: str
    data: ActionData | None = None  # None: the action's defaults


class Executor:
    def __init__(self, job: JobSpec, backend: Backend, emit: Emit,
                 pool: PoolState | None = None) -> None:
        self.job = job
        self.backend = backend
        self._emit = emit
        self.pool = pool or PoolState()
        self._refused: set[tuple[int, int, int | None]] = set()

    # --- events ---------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        self.pool = reduce(self.pool, event)
        self._emit(event)

    def unit_event(self, unit: str, state: UnitState, *, reason: str = "",
                   rank: int | None = None, epoch: int | None = None, pid: int | None = None,
                   command_id: str | None = None, resources: FlatMap | None = None,
                   released: list[str] | None = None) -> None:
        spec = self.job.unit(unit)
        payload = PoolUnit(unit=unit, state=state, node=self.job.node, labels=dict(spec.labels),
                           rank=rank, epoch=epoch, pid=pid, command_id=command_id,
                           reason=reason, resources=resources or {"cpus": list(spec.cpus)},
                           released=released or [])
        self.emit(make_event(payload, event_id=new_event_id(), job_id=self.job.job_id,
                             event_time=now_us(), source=SOURCE,
                             subject=Subject(node=self.job.node, unit=unit, rank=rank)))

    # --- the job --------------------------------------------------------------------------

    def register_units(self) -> list[str]:
        """Units of the spec the pool has never seen become spares (the event says so)."""
        new = [u.name for u in self.job.units if u.name not in self.pool.units]
        for name in new:
            self.unit_event(name, UnitState.SPARE, reason="registered from the job spec")
        return new

    def launch(self, placement: dict[int, str], command_id: str | None, reason: str) -> int:
        """Launch every rank at a new epoch; nothing of the job may be running."""
        live = self.pool.bound(self.job.job_id)
        if live:
            raise FenceError(f"ranks {sorted(live)} still bound: fence before launching")
        epoch = self.pool.job_epoch(self.job.job_id) + 1
        port = free_port()
        for rank in sorted(placement):
            unit = self.job.unit(placement[rank])
            rep = self.backend.launch(self.job, unit, rank, epoch, port)
            self.unit_event(unit.name, UnitState.BOUND, rank=rank, epoch=epoch, pid=rep.pid,
                            command_id=command_id, reason=reason,
                            resources={"cpus": list(unit.cpus), "create_time": rep.create_time,
                                       "port": port})
        return epoch

    def launch_initial(self) -> int:
        placement = {u.rank: u.name for u in self.job.units if u.rank is not None}
        return self.launch(placement, None, "initial launch from the job spec")

    def replicas(self) -> dict[int, Replica]:
        out: dict[int, Replica] = {}
        for rank, unit in self.pool.bound(self.job.job_id).items():
            created = unit.resources.get("create_time")
            out[rank] = Replica(rank, unit.name, unit.epoch or 0, unit.pid or 0,
                                float(created) if isinstance(created, int | float) else None)
        return out

    def fence_all(self, command_id: str | None, reason: str,
                  quarantine: Collection[str] = ()) -> tuple[list[str], float]:
        """Fence every bound replica of the job; the units in ``quarantine`` (those of failed
        ranks) say so and are not rebound. Returns what was released and the time."""
        t0 = time.monotonic()
        released: list[str] = []
        for rank, rep in sorted(self.replicas().items()):
            if rep.pid <= 0:
                continue
            try:
                rel = self.backend.fence(self.job, rep)
            except FenceError as exc:
                self.unit_event(rep.unit, UnitState.FAILED, reason=f"fencing failed: {exc}",
                                command_id=command_id)
                raise
            why = reason + (" (quarantined)" if rep.unit in quarantine else "")
            self.unit_event(rep.unit, UnitState.FENCED, rank=rank, epoch=rep.epoch,
                            pid=rep.pid, command_id=command_id, reason=why,
                            released=list(rel.items))
            released.extend(rel.items)
        return released, (time.monotonic() - t0) * 1000

    # --- commands -------------------------------------------------------------------------

    def execute(self, cmd: Command) -> Result:
        try:
            if cmd.action is CommandAction.RAISE_QUOTA:
                return self._raise_quota(cmd)
            if cmd.action in (CommandAction.MIGRATE, CommandAction.RESUME):
                return self._restart(cmd)
            if cmd.action is CommandAction.FENCE:
                released, ms = self.fence_all(cmd.command_id, "fence command")
                return Result(OutcomeStatus.DONE, f"fenced the job's replicas in {ms:.0f} ms",
                              FenceData(released=released, fence_ms=round(ms, 1)))
            if cmd.action is CommandAction.CHECKPOINT_NOW:
                return self._checkpoint_now(cmd)
            if cmd.action is CommandAction.ESCALATE:
                reason = cmd.params.reason or "no reason given"
                return Result(OutcomeStatus.DONE, f"escalated to a human: {reason}",
                              EscalateData(reason=reason))
            return Result(OutcomeStatus.FAILED, f"{cmd.action.value}: not supported")
        except (FenceError, JobSpecError, OSError) as exc:
            return Result(OutcomeStatus.FAILED, f"{cmd.action.value}: {exc}")

    def _rank(self, cmd: Command) -> int | None:
        return cmd.params.rank

    def _ranks(self, cmd: Command) -> list[int]:
        """The ranks a migrate moves: ``params.ranks``."""
        return sorted(set(_migrate(cmd).ranks))

    def _checkpoint_now(self, cmd: Command) -> Result:
        """Ask one bound replica (``params.rank``, else the lowest) to save; the ranks agree on
        the step among themselves. Done = asked; the ``checkpoint written`` event is the proof
        that it saved."""
        replicas = self.replicas()
        rank = self._rank(cmd)
        if rank is None and replicas:
            rank = min(replicas)
        rep = replicas.get(rank) if rank is not None else None
        if rep is None or rep.pid <= 0:
            return Result(OutcomeStatus.FAILED, f"checkpoint_now: rank {rank} is not bound")
        what = self.backend.request_checkpoint(self.job, rep)
        return Result(OutcomeStatus.DONE, what, CheckpointNowData(rank=rep.rank, pid=rep.pid))

    def _raise_quota(self, cmd: Command) -> Result:
        rank = self._rank(cmd)
        unit = self.pool.bound(self.job.job_id).get(rank) if rank is not None else None
        if unit is None:
            return Result(OutcomeStatus.FAILED, f"raise_quota: rank {rank} is not bound")
        pct_value = cmd.params.quota_pct if isinstance(cmd.params, RaiseQuotaParams) else None
        try:
            what = self.backend.set_quota(self.job, self.job.unit(unit.name), pct_value)
        except cgroups.CgroupError as exc:
            return Result(OutcomeStatus.FAILED, f"raise_quota: {exc}")
        return Result(OutcomeStatus.DONE, f"rank {rank} unit {unit.name}: {what}",
                      RaiseQuotaData(unit=unit.name, quota_pct=pct_value))

    def _restart(self, cmd: Command) -> Result:
        job = self.job.job_id
        bound = self.pool.bound(job)
        placement = {r: u.name for r, u in bound.items()}
        if len(placement) != self.job.world_size:
            return Result(OutcomeStatus.FAILED, f"{cmd.action.value}: only ranks "
                          f"{sorted(placement)} of {self.job.world_size} are bound; a human "
                          "must relaunch the job")
        data: dict[str, object] = {}  # RestartData's fields
        quarantine: list[str] = []
        moved = ""
        if cmd.action is CommandAction.MIGRATE:
            ranks = self._ranks(cmd)
            missing = [r for r in ranks if r is None or r not in bound]
            if missing:
                return Result(OutcomeStatus.FAILED, f"migrate: rank "
                              f"{', '.join(str(r) for r in missing)} is not bound")
            olds = {r: bound[r] for r in ranks if r is not None}
            avoid = parse_domains(_migrate(cmd).avoid_domains)
            kept = [f"rank {r} on {u.name} ({', '.join(format_domains(domains(u) & avoid))})"
                    for r, u in sorted(bound.items()) if r not in olds and domains(u) & avoid]
            if kept:
                return Result(OutcomeStatus.FAILED, "migrate: would rebind in a failed domain: "
                              + "; ".join(kept))
            plan = choose_spares(self.pool, job, olds, self._unreachable(
                self.pool.spares_for(job)), avoid)
            if plan.missing is not None:
                return Result(OutcomeStatus.FAILED, f"migrate: {plan.missing}",
                              _retry_when_storage(cmd, plan.storage_blocked))
            to = {r: c.unit.name for r, c in plan.moves.items() if c.unit is not None}
            placement.update(to)
            quarantine = [olds[r].name for r in sorted(olds)]
            named = self._rank(cmd)
            first = named if named is not None and named in olds else min(olds)
            data.update({"rank": first, "from_unit": olds[first].name, "to_unit": to[first],
                         "choice": plan.moves[first].reason,
                         "ranks": list(sorted(olds)),
                         "from_units": [olds[r].name for r in sorted(olds)],
                         "to_units": [to[r] for r in sorted(olds)],
                         "avoided_domains": list(format_domains(avoid))})
            moved = " " + ", ".join(f"rank {r} {olds[r].name} -> {to[r]}"
                                    for r in sorted(olds)) + ";"
        staying = [u for r, u in sorted(bound.items()) if placement[r] == u.name]
        blocked = self._unreachable(staying)
        if blocked:
            return Result(OutcomeStatus.FAILED, f"{cmd.action.value}: the job's storage cannot "
                          "be reached from " + "; ".join(f"{u}: {why}" for u, why in
                                                         sorted(blocked.items()))
                          + "; nothing was fenced", _retry_when_storage(cmd, True))
        t0 = time.monotonic()
        released, fence_ms = self.fence_all(cmd.command_id, f"{cmd.action.value}: replica "
                                            "replaced", quarantine)
        t1 = time.monotonic()
        epoch = self.launch(placement, cmd.command_id, f"{cmd.action.value} (tier {cmd.tier})")
        bind_ms = (time.monotonic() - t1) * 1000
        data.update({"epoch": epoch, "fence_ms": round(fence_ms, 1),
                     "bind_ms": round(bind_ms, 1), "released": released,
                     "total_ms": round((time.monotonic() - t0) * 1000, 1)})
        return Result(OutcomeStatus.DONE, f"{cmd.action.value}:{moved} {len(placement)} ranks "
                      f"fenced and relaunched at epoch {epoch}, resuming from the last valid "
                      "checkpoint", RestartData.model_validate({"action": cmd.action, **data}))

    def _unreachable(self, units: Iterable[Unit]) -> dict[str, str]:
        """Unit name -> why it cannot reach the job's storage, for those of ``units`` that
        cannot. A node's units share its mounts: one probe per node answers for all."""
        out: dict[str, str] = {}
        by_node: dict[str, str | None] = {}
        for unit in units:
            try:
                spec = self.job.unit(unit.name)
            except JobSpecError:
                out[unit.name] = "not a unit of this actuator's job spec"
                continue
            node = unit.node if unit.node is not None else f"unit {unit.name}"
            if node not in by_node:
                by_node[node] = self.backend.unreachable(self.job, spec)
            why = by_node[node]
            if why is not None:
                out[unit.name] = why
        return out

    # --- stale replicas -------------------------------------------------------------------

    def check_report(self, event: Event) -> bool:
        """Refuse a step report or heartbeat from a stale replica. True if it was refused."""
        p = event.payload
        if event.job_id != self.job.job_id or not isinstance(p, StepReport | Heartbeat):
            return False
        current = self.pool.epoch(event.job_id, p.rank)
        if current == 0 or not is_stale(p.binding_epoch, current):
            return False
        key = (p.rank, p.binding_epoch, p.pid)
        if key in self._refused:
            return True  # discarded again; said once
        self._refused.add(key)
        live_pids = {u.pid for u in self.pool.bound(event.job_id).values()}
        action: Literal["killed", "already_gone"] = "already_gone"
        if p.pid is not None and p.pid not in live_pids:
            ours = self.pool.launched.get(p.pid)
            if ours is not None and ours[:2] == (event.job_id, p.rank):
                if kill_now(p.pid, ours[2]):  # a replica this pool bound, same start time
                    action = "killed"
            elif is_replica_of(p.pid, event.job_id, p.rank) and kill_now(p.pid, None):
                action = "killed"  # started elsewhere, but its environment names the rank
        payload = ReplicaRefused(rank=p.rank, stale_epoch=p.binding_epoch,
                                 current_epoch=current, pid=p.pid, action=action,
                                 reason=f"{event.type} with binding epoch {p.binding_epoch} < "
                                        f"current {current}: reports discarded")
        self.emit(make_event(payload, event_id=derived_id("replica.refused", event.job_id,
                                                          *key),
                             job_id=event.job_id, event_time=now_us(), source=SOURCE,
                             subject=Subject(rank=p.rank, node=event.subject.node)))
        return True


def _retry_when_storage(cmd: Command, blocked: bool) -> ActionData | None:
    """Outcome data of a restart refused before anything was fenced: retryable when only the
    job's storage was in the way (it may come back)."""
    return RestartData(action=cmd.action, retry=RetryCondition.STORAGE_UNREACHABLE) if (
        blocked) else None


def _migrate(cmd: Command) -> MigrateParams:
    """A migrate command's parameters (the contract pairs them with the action)."""
    assert isinstance(cmd.params, MigrateParams), cmd.action
    return cmd.params
