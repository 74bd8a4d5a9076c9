"""The values evidence checks produce and consume. Plain, frozen, JSON-friendly."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from trainguard.compat import StrEnum

Kind = Literal["progress", "resources", "results", "expectation"]


class Status(StrEnum):
    PASS = "pass"
    FAIL = "fail"
    UNEXPLAINED = "unexplained"  # the log cannot say: missing or contradictory evidence
    NOT_APPLICABLE = "not_applicable"


class Conclusion(StrEnum):
    RECOVERED_AUTOMATICALLY = "recovered automatically"
    NEEDS_MANUAL_CONFIRMATION = "needs manual confirmation"
    NEEDS_MANUAL_RESTART = "needs manual restart"
    UNRECOVERABLE = "unrecoverable"
    RETEST = "retest"


@dataclass(frozen=True)
class Check:
    """One check's outcome with the events that back it (ids and event times, µs)."""

    kind: Kind
    name: str
    status: Status
    detail: str
    event_ids: tuple[str, ...] = ()
    times: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "status": self.status.value,
                "detail": self.detail, "event_ids": list(self.event_ids),
                "times": list(self.times)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Check:
        return Check(kind=d["kind"], name=d["name"], status=Status(d["status"]),
                     detail=d["detail"], event_ids=tuple(d.get("event_ids", ())),
                     times=tuple(d.get("times", ())))


@dataclass(frozen=True)
class CheckpointFile:
    """A checkpoint directory found on disk after the drill, verified against its manifest."""

    step: int
    valid: bool
    reason: str = ""
    quarantined: bool = False
    committed: bool = True


@dataclass(frozen=True)
class Artifacts:
    """What the runner found outside the log, at the end of the observation window.

    ``checkpoints``: every checkpoint directory, verified. ``temp_files``: leftovers of
    interrupted writes in the checkpoint directory. ``max_live_replicas``: the most live
    processes seen at one instant per rank (a process-table census; None when not taken).
    ``uids``: the uid of each rank process seen (pid -> uid)."""

    checkpoints: tuple[CheckpointFile, ...] = ()
    temp_files: tuple[str, ...] = ()
    max_live_replicas: Mapping[int, int] | None = None
    uids: Mapping[int, int] = field(default_factory=dict)
    collected: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"checkpoints": [c.__dict__ for c in self.checkpoints],
                "temp_files": list(self.temp_files),
                "max_live_replicas": None if self.max_live_replicas is None else
                {str(k): v for k, v in self.max_live_replicas.items()},
                "uids": {str(k): v for k, v in self.uids.items()},
                "collected": self.collected}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Artifacts:
        mlr = d.get("max_live_replicas")
        return Artifacts(
            checkpoints=tuple(CheckpointFile(**c) for c in d.get("checkpoints", ())),
            temp_files=tuple(d.get("temp_files", ())),
            max_live_replicas=None if mlr is None else {int(k): int(v) for k, v in mlr.items()},
            uids={int(k): int(v) for k, v in d.get("uids", {}).items()},
            collected=bool(d.get("collected", True)))


@dataclass(frozen=True)
class Baseline:
    """A fault-free run of the same job: each rank's loss at each step; its step time."""

    losses: Mapping[tuple[int, int], float]  # (rank, step) -> loss
    step_ms_median: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"losses": [[r, s, v] for (r, s), v in sorted(self.losses.items())],
                "step_ms_median": self.step_ms_median}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> Baseline:
        return Baseline(losses={(int(r), int(s)): float(v) for r, s, v in d.get("losses", ())},
                        step_ms_median=d.get("step_ms_median"))
