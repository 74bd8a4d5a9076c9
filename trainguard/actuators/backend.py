"""What the actuator needs from wherever ranks run: one small Protocol.

``local`` (``local.py``) runs ranks as processes on this machine. Kubernetes and Slurm are
designed in docs/actuators.md (the calls they would make), not implemented.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from trainguard.actuators.jobspec import JobSpec, UnitSpec


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
    how: str  # already_gone | sigterm | sigkill


class Backend(Protocol):
    def launch(self, job: JobSpec, unit: UnitSpec, rank: int, epoch: int,
               port: int) -> Replica: ...

    def fence(self, job: JobSpec, replica: Replica) -> Released:
        """Stop the replica (SIGTERM, SIGKILL after the job's grace), confirm it dead, release
        its unit. Raises ``FenceError`` when death cannot be confirmed."""
        ...

    def set_quota(self, job: JobSpec, unit: UnitSpec, pct: float | None) -> str: ...

    def request_checkpoint(self, job: JobSpec, replica: Replica) -> str:
        """Ask the replica's workload to save at its next step boundary (every rank saves at
        the same step; the ``checkpoint written`` event confirms it). Returns what was done;
        raises ``OSError`` when the replica cannot be asked."""
        ...

    def unreachable(self, job: JobSpec, unit: UnitSpec) -> str | None:
        """Why ``unit`` cannot reach the job's checkpoint storage, or None when it can."""
        ...
