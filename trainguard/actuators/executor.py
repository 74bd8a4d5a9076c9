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

An elastic job (``JobSpec.elastic``: each unit runs a launcher such as torchrun that re-forms
the group by itself) is migrated in part: only the moved ranks' replicas are fenced and
relaunched, into the launcher's rendezvous; the others keep their replicas, their launchers
restarting the workers into the new round. The group still moves to one new epoch: it is
written to the job's epoch file (``JobSpec.epoch_file``) before the moved ranks launch, so
every worker that starts in the new round reads it, and the kept replicas are bound at it
(their ``launch_epoch`` resource keeps what the backend launched them at). Reports and exits
of the old workers are then a replaced binding's, as after any restart. A resume, and a
command found in flight after a crash, restart every rank as above (the launchers meet again
once the rendezvous has dropped the dead ones).

Crash safety: every launch and restart is write-ahead in the command journal
(``journal.py``): ``intent`` (the plan: placement, quarantined units, the command) before
anything is fenced, then ``fenced``, ``launched``, ``done``. ``recover`` (called by a
restarted actuator before it serves) finishes the command that has no ``done``: when the
replicas the backend proves alive are already exactly the plan at a newer epoch, it adopts
them (and puts the pool right); otherwise it fences whatever is left (proven replicas only)
and launches the plan at a fresh epoch. It only rolls forward: the plan was checked (spares,
storage) before its intent was written.

Which replicas exist is the backend's own record (``Backend.live``, ``Backend.epoch``), never
the event log: a stale report's pid is killed only when the backend started exactly that
replica and proves it (``Backend.stop_stale``), and fencing never signals a pid it cannot
prove. ``TRAINGUARD_TEST_CRASH_AT`` names a fault point (``FAULT_POINTS``) at which the
actuator SIGKILLs itself, for the crash tests.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from trainguard_sdk.checkpoint.atomic import atomic_write_bytes

from trainguard.actuators import cgroups
from trainguard.actuators.backend import (
    Backend,
    KnowsHealth,
    Quarantines,
    Replica,
    SetsQuota,
    UnitNodes,
    WatchesAllocation,
)
from trainguard.actuators.fencing import FenceError, is_stale
from trainguard.actuators.jobspec import JobSpec, JobSpecError
from trainguard.actuators.journal import Intent, Journal, Phase, in_flight, phase_record
from trainguard.actuators.pool import (
    LAUNCH_EPOCH,
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
    JobEnded,
    MigrateParams,
    OutcomeStatus,
    PoolUnit,
    RaiseQuotaData,
    RaiseQuotaParams,
    ReplicaRefused,
    RestartData,
    RetryCondition,
    StepReport,
    StopProof,
    UnitState,
)

Emit = Callable[[Event], None]
SOURCE = "trainguard-actuator"
log = logging.getLogger(__name__)
FAULT_ENV = "TRAINGUARD_TEST_CRASH_AT"
# where a command can be cut short: after its intent, after its first fenced replica, after
# the fence, after its first launched rank, after the launch (before ``done``); named
# ``ACTION:POINT`` (``migrate:fenced``; ``launch:...`` is the initial launch)
FAULT_POINTS = ("intent", "fenced-1", "fenced", "launched-1", "launched")


def fault_from_env() -> Callable[[str], None]:
    """Test-only: SIGKILL this process at the fault point ``ACTION:POINT`` named by
    ``TRAINGUARD_TEST_CRASH_AT`` (no-op when unset)."""
    at = os.environ.get(FAULT_ENV)

    def fault(point: str) -> None:
        if at is not None and point == at:
            os.kill(os.getpid(), signal.SIGKILL)
    return fault


def _no_fault(point: str) -> None:
    return None


@dataclass
class Result:
    status: OutcomeStatus
    detail: str
    data: ActionData | None = None  # None: the action's defaults


@dataclass(frozen=True)
class Recovered:
    """A command a restarted actuator found in flight, and how it ended."""

    intent: Intent
    command: Command | None  # None: the initial launch
    result: Result


class Executor:
    def __init__(self, job: JobSpec, backend: Backend, emit: Emit,
                 pool: PoolState | None = None, journal: Journal | None = None,
                 fault: Callable[[str], None] = _no_fault) -> None:
        self.job = job
        self.backend = backend
        self._emit = emit
        self.pool = pool or PoolState()
        self.journal = journal or Journal(None)
        self._fault_at = fault
        self._doing = "launch"  # the action under way, for the fault points
        self._refused: set[tuple[int, int, int | None]] = set()
        self.ended: JobEnded | None = None  # the scheduler ended the job's allocation
        self._watch_failing = False

    def _fault(self, point: str) -> None:
        self._fault_at(f"{self._doing}:{point}")

    def _phase(self, cid: str, phase: Phase, status: str | None = None) -> None:
        self.journal.append(phase_record(cid, phase, status))
        if phase != "done":
            self._fault(phase)

    # --- events ---------------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        self.pool = reduce(self.pool, event)
        self._emit(event)

    def unit_event(self, unit: str, state: UnitState, *, reason: str = "",
                   rank: int | None = None, epoch: int | None = None, pid: int | None = None,
                   command_id: str | None = None, resources: FlatMap | None = None,
                   released: list[str] | None = None, stopped: StopProof | None = None
                   ) -> None:
        spec = self.job.unit(unit)
        node = (self.backend.node_of(unit) if isinstance(self.backend, UnitNodes)
                else self.job.node)
        payload = PoolUnit(unit=unit, state=state, node=node, labels=dict(spec.labels),
                           rank=rank, epoch=epoch, pid=pid, command_id=command_id,
                           reason=reason, resources=resources or {"cpus": list(spec.cpus)},
                           released=released or [], stopped=stopped,
                           quota=isinstance(self.backend, SetsQuota))
        self.emit(make_event(payload, event_id=new_event_id(), job_id=self.job.job_id,
                             event_time=now_us(), source=SOURCE,
                             subject=Subject(node=node, unit=unit, rank=rank)))

    def watch_allocation(self) -> JobEnded | None:
        """Has the scheduler ended the job's allocation (a backend that ``WatchesAllocation``)?
        The first time it has, say so on the log (``job.ended``, its id derived from the
        allocation: a restarted actuator says the same event again). None while it lives, with
        no scheduler, or when the scheduler cannot be asked (logged once until it answers)."""
        if self.ended is not None or not isinstance(self.backend, WatchesAllocation):
            return self.ended
        try:
            end = self.backend.job_end()
        except OSError as exc:
            if not self._watch_failing:
                log.warning("actuator %s: cannot read the allocation's state: %s",
                            self.job.job_id, exc)
            self._watch_failing = True
            return None
        self._watch_failing = False
        if end is not None:
            self.ended = end
            self.emit(make_event(end, event_id=derived_id("job.ended", self.job.job_id,
                                                          end.allocation),
                                 job_id=self.job.job_id, event_time=now_us(), source=SOURCE))
        return end

    # --- the job --------------------------------------------------------------------------

    def register_units(self) -> list[str]:
        """Units of the spec the pool has never seen become spares (the event says so), but a
        spare the backend's scheduler finds unusable (``KnowsHealth``) is registered failed,
        with its word."""
        new = [u.name for u in self.job.units if u.name not in self.pool.units]
        spares = [u.name for u in self.job.units if u.name in new and u.rank is None]
        bad = self.backend.unusable(spares) if isinstance(self.backend, KnowsHealth) else {}
        for name in new:
            if name in bad:
                self.unit_event(name, UnitState.FAILED,
                                reason=f"registered from the job spec: {bad[name]}")
            else:
                self.unit_event(name, UnitState.SPARE, reason="registered from the job spec")
        return new

    def launch(self, placement: dict[int, str], command_id: str | None, reason: str,
               only: Collection[int] | None = None) -> int:
        """Launch every rank of ``placement`` (``only``: just those, an elastic job's migrate)
        at a new epoch; none of them may be running."""
        ranks = sorted(placement if only is None else only)
        live = sorted(set(self.pool.bound(self.job.job_id)) & set(ranks))
        running = sorted({r.rank for r in self.backend.live(self.job)} & set(ranks))
        if live or running:
            raise FenceError(f"ranks {live or running} still "
                             f"{'bound' if live else 'running'}: fence before launching")
        epoch = max(self.pool.job_epoch(self.job.job_id), self.backend.epoch(self.job)) + 1
        port, master = free_port(), self.job.master_addr(placement)
        if self.job.epoch_file is not None:  # before any rank of this epoch can start
            write_epoch(self.job.epoch_file, epoch)
        for n, rank in enumerate(ranks):
            unit = self.job.unit(placement[rank])
            rep = self.backend.launch(self.job, unit, rank, epoch, port, command_id, master)
            self.unit_event(unit.name, UnitState.BOUND, rank=rank, epoch=epoch, pid=rep.pid,
                            command_id=command_id, reason=reason,
                            resources={"cpus": list(unit.cpus), "create_time": rep.create_time,
                                       "port": port})
            if n == 0:
                self._fault("launched-1")
        return epoch

    def launch_initial(self) -> int:
        placement = {u.rank: u.name for u in self.job.units if u.rank is not None}
        reason = "initial launch from the job spec"
        self._doing = "launch"
        intent = Intent(f"initial-{new_event_id()}", "launch", placement, reason=reason,
                        from_epoch=self.pool.job_epoch(self.job.job_id))
        self.journal.append(intent.to_record())
        self._fault("intent")
        try:
            epoch = self.launch(placement, None, reason)
        except (FenceError, JobSpecError, OSError):
            self._phase(intent.cid, "done", OutcomeStatus.FAILED.value)
            raise
        self._phase(intent.cid, "launched")
        self._phase(intent.cid, "done", OutcomeStatus.DONE.value)
        return epoch

    def replicas(self) -> dict[int, Replica]:
        """The bound replicas, each at the epoch its backend launched it at (an elastic job's
        kept replica is bound at a later one: ``launch_epoch``)."""
        out: dict[int, Replica] = {}
        for rank, unit in self.pool.bound(self.job.job_id).items():
            created = unit.resources.get("create_time")
            launched = unit.resources.get(LAUNCH_EPOCH)
            epoch = launched if isinstance(launched, int) else unit.epoch or 0
            out[rank] = Replica(rank, unit.name, epoch, unit.pid or 0,
                                float(created) if isinstance(created, int | float) else None)
        return out

    def fence_all(self, command_id: str | None, reason: str,
                  quarantine: Collection[str] = (),
                  only: Collection[int] | None = None) -> tuple[list[str], float]:
        """Fence every replica of the job (``only``: of those ranks): those the pool shows
        bound and those the backend proves alive (a launch whose event never reached the log);
        the units in ``quarantine`` (those of failed ranks) say so and are not rebound.
        Returns what was released and the time."""
        t0 = time.monotonic()
        released: list[str] = []
        targets = {(rep.unit, rep.pid): rep for rep in self.replicas().values()
                   if rep.pid > 0 and (only is None or rep.rank in only)}
        for rep in self.backend.live(self.job):
            if only is None or rep.rank in only:
                targets.setdefault((rep.unit, rep.pid), rep)
        for n, (_, rep) in enumerate(sorted(targets.items(), key=lambda kv: (
                kv[1].rank, kv[1].epoch, kv[1].pid))):
            try:
                rel = self.backend.fence(self.job, rep)
            except FenceError as exc:
                self.unit_event(rep.unit, UnitState.FAILED, reason=f"fencing failed: {exc}",
                                command_id=command_id)
                raise
            why = reason + (" (quarantined)" if rep.unit in quarantine else "")
            self.unit_event(rep.unit, UnitState.FENCED, rank=rep.rank, epoch=rep.epoch,
                            pid=rep.pid, command_id=command_id, reason=why,
                            released=list(rel.items), stopped=rel.how)
            released.extend(rel.items)
            if n == 0:
                self._fault("fenced-1")
        return released, (time.monotonic() - t0) * 1000

    # --- crash recovery -------------------------------------------------------------------

    def recover(self) -> Recovered | None:
        """Finish the command the journal shows in flight (see the module docstring); None
        when there is none."""
        intent = in_flight(self.journal)
        if intent is None:
            return None
        command: Command | None = None
        if intent.command is not None:
            try:
                command = Command.model_validate(intent.command)
            except ValidationError:
                command = None
        cid = intent.cid
        self._doing = "recover"
        reason = f"{intent.action}: finished after an actuator restart"
        t0 = time.monotonic()
        try:
            live = self.backend.live(self.job)
            epochs = {r.epoch for r in live}
            finished = (len(live) == len(intent.placement)
                        and {r.rank: r.unit for r in live} == dict(intent.placement)
                        and len(epochs) == 1 and min(epochs) > intent.from_epoch)
            if finished:
                self._adopt(live, intent)
                epoch = min(epochs)
                how = "the launch had finished: adopted its replicas"
            else:
                self.fence_all(command.command_id if command else None, reason,
                               intent.quarantine)
                self._phase(cid, "fenced")
                epoch = self.launch(dict(intent.placement),
                                    command.command_id if command else None, reason)
                self._phase(cid, "launched")
                how = "fenced what was left and launched the plan"
        except (FenceError, JobSpecError, OSError) as exc:
            self._phase(cid, "done", OutcomeStatus.FAILED.value)
            return Recovered(intent, command, Result(
                OutcomeStatus.FAILED, f"{reason} failed: {exc}"))
        self._phase(cid, "done", OutcomeStatus.DONE.value)
        ms = (time.monotonic() - t0) * 1000
        data = RestartData(action=command.action, epoch=epoch, recovered_from=intent.phase,
                           recovery_ms=round(ms, 1)) if command is not None and \
            command.action in (CommandAction.MIGRATE, CommandAction.RESUME) else None
        return Recovered(intent, command, Result(
            OutcomeStatus.DONE, f"{reason} (it was cut short after '{intent.phase}'): {how}; "
            f"{len(intent.placement)} ranks at epoch {epoch}", data))

    def _adopt(self, live: list[Replica], intent: Intent) -> None:
        """The plan's replicas run: put the pool right (events the crash kept off the log)."""
        cid = intent.command.get("command_id") if intent.command else None
        command_id = cid if isinstance(cid, str) else None
        keep = {(r.unit, r.pid) for r in live}
        for rank, old in sorted(self.replicas().items()):
            if (old.unit, old.pid) not in keep and old.pid > 0:
                rel = self.backend.fence(self.job, old)
                why = "replaced before an actuator restart" + (
                    " (quarantined)" if old.unit in intent.quarantine else "")
                self.unit_event(old.unit, UnitState.FENCED, rank=rank, epoch=old.epoch,
                                pid=old.pid, command_id=command_id, reason=why,
                                released=list(rel.items), stopped=rel.how)
        bound = self.pool.bound(self.job.job_id)
        for rep in live:
            now = bound.get(rep.rank)
            if now is None or (now.name, now.pid, now.epoch) != (rep.unit, rep.pid, rep.epoch):
                unit = self.job.unit(rep.unit)
                self.unit_event(rep.unit, UnitState.BOUND, rank=rep.rank, epoch=rep.epoch,
                                pid=rep.pid, command_id=command_id,
                                reason=f"{intent.action}: adopted after an actuator restart",
                                resources={"cpus": list(unit.cpus)})

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
            if cmd.action in (CommandAction.MIGRATE, CommandAction.RESUME):
                self.watch_allocation()  # ended under the restart: say so before the failure
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
        if not isinstance(self.backend, SetsQuota):
            return Result(OutcomeStatus.FAILED, f"raise_quota: unit {unit.name}: the "
                          f"{type(self.backend).__name__} backend sets no CPU quota (its units "
                          "say quota false: tier 1 has no command there)")
        try:
            what = self.backend.set_quota(self.job, self.job.unit(unit.name), pct_value)
        except cgroups.CgroupError as exc:
            return Result(OutcomeStatus.FAILED, f"raise_quota: {exc}")
        return Result(OutcomeStatus.DONE, f"rank {rank} unit {unit.name}: {what}",
                      RaiseQuotaData(unit=unit.name, quota_pct=pct_value))

    def _restart(self, cmd: Command) -> Result:
        job = self.job.job_id
        end = self.watch_allocation()
        if end is not None:
            return Result(OutcomeStatus.FAILED, f"{cmd.action.value}: the scheduler ended the "
                          f"job's allocation {end.allocation} ({end.state}): there is nothing to "
                          "restart the job in")
        bound = self.pool.bound(job)
        placement = {r: u.name for r, u in bound.items()}
        if len(placement) != self.job.world_size:
            return Result(OutcomeStatus.FAILED, f"{cmd.action.value}: only ranks "
                          f"{sorted(placement)} of {self.job.world_size} are bound; a human "
                          "must relaunch the job")
        data: dict[str, object] = {}  # RestartData's fields
        quarantine: list[str] = []
        moved = ""
        only: set[int] | None = None  # an elastic job's migrate: the moved ranks alone
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
            if self.job.elastic:
                only = set(olds)
        staying = [u for r, u in sorted(bound.items()) if placement[r] == u.name]
        blocked = self._unreachable(staying)
        if blocked:
            return Result(OutcomeStatus.FAILED, f"{cmd.action.value}: the job's storage (or its "
                          "agent) cannot be reached from " + "; ".join(f"{u}: {why}" for u, why in
                                                         sorted(blocked.items()))
                          + "; nothing was fenced", _retry_when_storage(cmd, True))
        intent = Intent(cmd.command_id, cmd.action.value, placement, tuple(quarantine),
                        f"{cmd.action.value} (tier {cmd.tier})", cmd.model_dump(mode="json"),
                        self.pool.job_epoch(job))
        self._doing = cmd.action.value
        self.journal.append(intent.to_record())  # write-ahead: nothing fenced yet
        self._fault("intent")
        t0 = time.monotonic()
        self._quarantine(quarantine, cmd)
        try:
            released, fence_ms = self.fence_all(cmd.command_id, f"{cmd.action.value}: replica "
                                                "replaced", quarantine, only)
            self._phase(cmd.command_id, "fenced")
            t1 = time.monotonic()
            epoch = self.launch(placement, cmd.command_id, intent.reason, only)
            if only is not None:
                self._rebind_kept(epoch, only, cmd.command_id)
            bind_ms = (time.monotonic() - t1) * 1000
            self._phase(cmd.command_id, "launched")
        except (FenceError, JobSpecError, OSError):
            self._phase(cmd.command_id, "done", OutcomeStatus.FAILED.value)
            raise
        self._phase(cmd.command_id, "done", OutcomeStatus.DONE.value)
        data.update({"epoch": epoch, "fence_ms": round(fence_ms, 1),
                     "bind_ms": round(bind_ms, 1), "released": released,
                     "total_ms": round((time.monotonic() - t0) * 1000, 1)})
        done = RestartData.model_validate({"action": cmd.action, **data})
        if only is not None:
            keeping = sorted(set(placement) - only)
            return Result(OutcomeStatus.DONE, f"{cmd.action.value}:{moved} {len(only)} "
                          f"rank(s) fenced and relaunched at epoch {epoch} into the job's "
                          f"rendezvous; ranks {keeping} keep their replicas (their launchers "
                          "restart the workers), every rank resuming from the last valid "
                          "checkpoint", done)
        return Result(OutcomeStatus.DONE, f"{cmd.action.value}:{moved} {len(placement)} ranks "
                      f"fenced and relaunched at epoch {epoch}, resuming from the last valid "
                      "checkpoint", done)

    def _rebind_kept(self, epoch: int, moved: Collection[int], command_id: str) -> None:
        """An elastic job's ranks that kept their replicas through a migrate: bound at the
        group's new epoch (their launchers restart the workers into the new round, and the
        workers read the epoch from the job's epoch file). ``launch_epoch`` keeps the epoch
        the backend launched the replica at: it is what the backend's own record names."""
        for rank, unit in sorted(self.pool.bound(self.job.job_id).items()):
            if rank in moved or unit.epoch == epoch:
                continue
            launched = unit.resources.get(LAUNCH_EPOCH, unit.epoch)
            self.unit_event(unit.name, UnitState.BOUND, rank=rank, epoch=epoch, pid=unit.pid,
                            command_id=command_id,
                            reason=f"kept through the migrate: its launcher restarts the "
                                   f"workers at epoch {epoch}",
                            resources={**unit.resources, LAUNCH_EPOCH: launched})

    def _quarantine(self, units: Iterable[str], cmd: Command) -> None:
        """Tell the scheduler (a backend that has one) to place nothing on ``units``."""
        if not isinstance(self.backend, Quarantines):
            return
        causes = ",".join(cmd.cause_verdict_ids) or "-"
        for unit in units:
            try:
                what = self.backend.quarantine(self.job, unit, f"trainguard {cmd.command_id} "
                                               f"verdicts {causes}")
                log.info("quarantined %s: %s", unit, what)
            except OSError as exc:
                log.warning("could not quarantine %s: %s", unit, exc)

    def _unreachable(self, units: Iterable[Unit]) -> dict[str, str]:
        """Unit name -> why it cannot serve the job (the job's storage, or on Slurm the node's
        agent), for those of ``units`` that cannot. A node's units share its mounts and its
        agent: one probe per node answers for all."""
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
        current = self.backend.epoch(self.job, p.rank)  # what this actuator launched
        if current == 0 or not is_stale(p.binding_epoch, current):
            return False
        key = (p.rank, p.binding_epoch, p.pid)
        if key in self._refused:
            return True  # discarded again; said once
        self._refused.add(key)
        # the backend signals only a replica it started at that epoch and still proves
        action = self.backend.stop_stale(self.job, p.rank, p.binding_epoch, p.pid)
        payload = ReplicaRefused(rank=p.rank, stale_epoch=p.binding_epoch,
                                 current_epoch=current, pid=p.pid, action=action,
                                 reason=f"{event.type} with binding epoch {p.binding_epoch} < "
                                        f"current {current}: reports discarded")
        self.emit(make_event(payload, event_id=derived_id("replica.refused", event.job_id,
                                                          *key),
                             job_id=event.job_id, event_time=now_us(), source=SOURCE,
                             subject=Subject(rank=p.rank, node=event.subject.node)))
        return True


def write_epoch(path: Path, epoch: int) -> None:
    """An elastic job's binding epoch, for its workers to read as they start: written whole
    (the checkpoints' own atomic write: temp file, fsync, rename, directory fsync), so a
    worker reads the old epoch or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, f"{epoch}\n".encode())


def _retry_when_storage(cmd: Command, blocked: bool) -> ActionData | None:
    """Outcome data of a restart refused before anything was fenced: retryable when only the
    job's storage was in the way (it may come back)."""
    return RestartData(action=cmd.action, retry=RetryCondition.STORAGE_UNREACHABLE) if (
        blocked) else None


def _migrate(cmd: Command) -> MigrateParams:
    """A migrate command's parameters (the contract pairs them with the action)."""
    assert isinstance(cmd.params, MigrateParams), cmd.action
    return cmd.params
