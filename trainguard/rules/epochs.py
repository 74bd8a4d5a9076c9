"""Binding epochs: which replica of a rank is the current one.

Every binding of a rank to a compute unit carries an epoch (``StepReport.binding_epoch``,
``Heartbeat.binding_epoch``, ``ProcessExit.binding_epoch``); a remediation binds a new replica
with a higher epoch, and the job goes back to its checkpoint (steps restart at checkpoint + 1).
The gate sits between the reorder buffer and the rules, so it sees the job's events in
event-time order and decides the same in live processing and replay:

- ``ADMIT``: the current replica (or a rank seen for the first time);
- ``REBIND``: the first sign of a newer epoch: the rules forget that rank's per-rank state
  (``RuleBase.rebind``), then take the event;
- ``STALE``: a report, heartbeat or exit of an older epoch than the newest seen for the rank (a
  stale replica, or the exit of the process a rebinding replaced): counted, never evaluated.
  An exit without an epoch is stale when its pid belonged to an older epoch of the rank.

State is plain JSON: ``{rank: [epoch, current pid or None, [pids of older epochs]]}``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from trainguard.events.envelope import Event
from trainguard.events.payloads import Heartbeat, ProcessExit, StepReport

OLD_PIDS = 8  # pids of earlier epochs remembered per rank (exits without an epoch)


class Gate(Enum):
    ADMIT = 0
    REBIND = 1
    STALE = 2


class EpochGate:
    types = frozenset({"step.report", "heartbeat", "process.exit"})

    def __init__(self) -> None:
        self.ranks: dict[str, list[Any]] = {}
        self.stale = 0

    def check(self, event: Event) -> Gate:
        payload = event.payload
        kind = type(payload)
        if kind is StepReport or kind is Heartbeat:
            rep: StepReport | Heartbeat = payload  # type: ignore[assignment]
            return self._see(str(rep.rank), rep.binding_epoch, rep.pid)
        if kind is ProcessExit:
            ex: ProcessExit = payload  # type: ignore[assignment]
            if ex.rank is None:
                return Gate.ADMIT
            rank = str(ex.rank)
            if ex.binding_epoch is not None:
                return self._see(rank, ex.binding_epoch, None)
            entry = self.ranks.get(rank)
            if entry is not None and ex.pid in entry[2]:
                self.stale += 1
                return Gate.STALE
        return Gate.ADMIT

    def _see(self, rank: str, epoch: int, pid: int | None) -> Gate:
        entry = self.ranks.get(rank)
        if entry is None:
            self.ranks[rank] = [epoch, pid, []]
            return Gate.ADMIT
        if epoch == entry[0]:
            if pid is not None and pid != entry[1]:
                entry[1] = pid
            return Gate.ADMIT
        if epoch < entry[0]:
            self.stale += 1
            return Gate.STALE
        old: list[int] = entry[2]
        if entry[1] is not None and entry[1] != pid and entry[1] not in old:
            old.append(entry[1])
            if len(old) > OLD_PIDS:
                del old[0]
        entry[0] = epoch
        entry[1] = pid
        return Gate.REBIND

    def epoch(self, rank: int) -> int | None:
        entry = self.ranks.get(str(rank))
        return None if entry is None else int(entry[0])

    def snapshot(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "stale": self.stale}

    def restore(self, doc: dict[str, Any]) -> None:
        self.ranks = {k: [int(v[0]), v[1], list(v[2])] for k, v in doc["ranks"].items()}
        self.stale = int(doc["stale"])
