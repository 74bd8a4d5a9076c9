"""What the actuator needs from wherever ranks run: one small Protocol.

``local`` (``local.py``) runs ranks as processes on this machine. Kubernetes and Slurm are
designed in docs/actuators.md (the calls they would make), not implemented.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from trainguard.actuators.jobspec import JobSpec, UnitSpec
from trainguard.events.payloads import JobEnded, StopProof


@dataclass(frozen=True)
class Replica:
    """One running replica of one rank, bound to a unit at an epoch."""

    rank: int
    unit: str
    epoch: int
    pid: int
    create_time: float | None = None


@dataclass(frozen=True)
class Released:
    """What fencing a replica gave back: its process (confirmed dead) and the unit's resources."""

    items: tuple[str, ...]
    how: StopProof  # already_gone | sigterm | sigkill | not_ours (never signalled)


StaleAction = Literal["killed", "already_gone", "discarded"]


class Backend(Protocol):
    """Everything here acts only on replicas the backend itself started and recorded (the
    local backend: its replica journal; Slurm: the job steps it submitted). The event log may
    name any pid: a replica the backend cannot prove is its own is never signalled."""

    def launch(self, job: JobSpec, unit: UnitSpec, rank: int, epoch: int, port: int,
               command_id: str | None = None, master_addr: str | None = None) -> Replica:
        """Start one replica; it is recorded durably before it may run. ``port`` and
        ``master_addr`` (rank 0's unit's address at this launch) fill the command's
        ``{port}`` and ``{master_addr}``."""
        ...

    def fence(self, job: JobSpec, replica: Replica) -> Released:
        """Stop the replica (SIGTERM, SIGKILL after the job's grace), confirm it dead, release
        its unit. One the backend did not start (or whose pid now names another process) is
        not signalled (``how`` says so). Raises ``FenceError`` when death cannot be
        confirmed."""
        ...

    def live(self, job: JobSpec) -> list[Replica]:
        """The job's replicas this backend started that are still alive, proven."""
        ...

    def epoch(self, job: JobSpec, rank: int | None = None) -> int:
        """The highest epoch this backend started ``rank`` (any rank: None) at; 0: never."""
        ...

    def stop_stale(self, job: JobSpec, rank: int, epoch: int, pid: int | None) -> StaleAction:
        """A report said ``pid`` runs ``rank`` at the stale ``epoch``: kill it if the backend
        started exactly that replica and proves it alive (``killed``); ``already_gone`` when
        it did and it is gone; ``discarded`` (nothing signalled) when it never started it."""
        ...

    def request_checkpoint(self, job: JobSpec, replica: Replica) -> str:
        """Ask the replica's workload to save at its next step boundary (every rank saves at
        the same step; the ``checkpoint written`` event confirms it). Returns what was done;
        raises ``OSError`` when the replica cannot be asked."""
        ...

    def unreachable(self, job: JobSpec, unit: UnitSpec) -> str | None:
        """Why ``unit`` cannot serve the job, or None when it can: the job's checkpoint storage
        cannot be reached from it (every backend), or its node's agent does not answer on the
        job's agent socket (Slurm)."""
        ...


@runtime_checkable
class SetsQuota(Protocol):
    """A backend that can cap or lift a unit's CPU share (the local backend: the unit's cgroup):
    tier 1 of a straggler's ladder. Slurm has none (no per-step CPU quota): its units say so in
    their ``pool.unit`` events (``quota`` false) and decide skips tier 1 for them (the verdict
    gets tier 1's windows to clear by itself before tier 2)."""

    def set_quota(self, job: JobSpec, unit: UnitSpec, pct: float | None) -> str: ...


@runtime_checkable
class KnowsHealth(Protocol):
    """A backend whose scheduler keeps its own view of each unit (Slurm: sinfo's node state and
    the allocation). ``unusable(units)`` maps each of ``units`` the scheduler would place no
    work on now to why; a unit it leaves out is usable. The executor registers a spare of the
    job spec that is unusable as ``failed`` with that reason, never as a spare: the pool is the
    spec joined with the scheduler's view. A view that cannot be read leaves the spec's."""

    def unusable(self, units: Sequence[str]) -> Mapping[str, str]: ...


@runtime_checkable
class Quarantines(Protocol):
    """A backend whose scheduler can be told to stop placing work on a unit (Slurm: drain the
    node, the reason shown in sinfo). The executor calls it for the units a migrate
    quarantines, before fencing them; a failure is logged, fencing goes on."""

    def quarantine(self, job: JobSpec, unit: str, reason: str) -> str: ...


@runtime_checkable
class UnitNodes(Protocol):
    """A backend whose units are on nodes of their own (Slurm: a unit is a node). The executor
    names that node in a unit's ``pool.unit`` events instead of the job spec's one node, so a
    node-level verdict (``node_silent`` at ``tgn2``) finds the ranks bound there."""

    def node_of(self, unit: str) -> str: ...


@runtime_checkable
class WatchesAllocation(Protocol):
    """A backend whose job lives in a scheduler's allocation, which the scheduler may end
    (Slurm: a cancel, the time limit, preemption, a failed node without ``--no-kill``). The
    actuator asks about every second and before every restart; once it has ended, the
    actuator says so on the log (``job.ended``), once, and restarts nothing."""

    def job_end(self) -> JobEnded | None:
        """How the scheduler ended the allocation; None while it lives. Raises ``OSError``
        when the scheduler cannot be asked."""
        ...
