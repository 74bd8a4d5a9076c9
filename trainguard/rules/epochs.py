"""Binding epochs: which replica of a rank is the current one.

Every binding of a rank to a compute unit carries an epoch; a remediation binds a new replica
with a higher epoch, and the job goes back to its checkpoint (steps restart at checkpoint + 1).
Who holds which epoch is a *pool* fact: it is believed only from ``pool.unit`` ``bound``
events, which the actuator signs and the edge (streams worker, replay) verifies before they
reach the engine. A report's own ``binding_epoch`` (``StepReport``, ``Heartbeat``,
``ProcessExit``) is unsigned: it can only be found older than the verified binding; it never
moves the epoch. (Before, one forged step report with a higher epoch made
the rank's real reports stale.)

The gate sits between the reorder buffer and the rules, so it sees the job's events in
event-time order and decides the same in live processing and replay:

- ``ADMIT``: a report at or above the rank's bound epoch (a newer claim is evidence like any
  report, but moves nothing: a binding whose event came too late for the reorder buffer must
  not leave the new replica unheard), or from the bound pid whatever epoch it claims (a
  workload that does not read ``TRAINGUARD_BINDING_EPOCH`` reports 0), a report of a rank
  without a verified binding (a job no actuator runs, or run without pool events), or the
  first binding of a rank;
- ``REBIND``: a verified binding of a rank at a higher epoch than the one bound, or the first
  binding of a rank whose reports were already admitted: the rules forget that rank's
  per-rank state (``RuleBase.rebind``);
- ``STALE``: a report, heartbeat or exit of another pid with an epoch older than the rank's
  bound one (a replaced replica), or an exit without an epoch whose pid belonged to an older
  binding of the rank: counted, never evaluated.

State: ``{rank: Binding}``; as JSON ``{rank: [epoch, bound pid or None, [pids of older
epochs]]}`` and the
ranks seen reporting before any binding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

from trainguard.events.envelope import Event
from trainguard.events.payloads import Heartbeat, PoolUnit, ProcessExit, StepReport, UnitState

OLD_PIDS = 8  # pids of earlier epochs remembered per rank (exits without an epoch)


class Gate(Enum):
    ADMIT = 0
    REBIND = 1
    STALE = 2


@dataclass(slots=True)
class Binding:
    """A rank's verified binding (JSON: ``[epoch, pid, old]``)."""

    epoch: int
    pid: int | None  # the bound replica's pid, when known
    old: list[int] = field(default_factory=list)  # pids of older epochs, newest last

    def doc(self) -> list[Any]:
        return [self.epoch, self.pid, self.old]


class EpochGate:
    types: ClassVar[frozenset[str]] = frozenset(
        {"step.report", "heartbeat", "process.exit", "pool.unit"})

    def __init__(self) -> None:
        self.ranks: dict[str, Binding] = {}
        self.seen: set[str] = set()  # ranks with an admitted report before any binding
        self.stale = 0

    def check(self, event: Event) -> Gate:
        payload = event.payload
        kind = type(payload)
        if kind is StepReport or kind is Heartbeat:
            rep: StepReport | Heartbeat = payload  # type: ignore[assignment]
            return self._report(str(rep.rank), rep.binding_epoch, rep.pid)
        if kind is ProcessExit:
            ex: ProcessExit = payload  # type: ignore[assignment]
            if ex.rank is None:
                return Gate.ADMIT
            rank = str(ex.rank)
            if ex.binding_epoch is not None:
                return self._report(rank, ex.binding_epoch, ex.pid)
            entry = self.ranks.get(rank)
            if entry is not None and ex.pid in entry.old:
                self.stale += 1
                return Gate.STALE
            return Gate.ADMIT
        if kind is PoolUnit:
            unit: PoolUnit = payload  # type: ignore[assignment]
            if unit.state is UnitState.BOUND and unit.rank is not None \
                    and unit.epoch is not None:
                return self.bind(str(unit.rank), unit.epoch, unit.pid)
        return Gate.ADMIT

    def _report(self, rank: str, epoch: int, pid: int | None) -> Gate:
        entry = self.ranks.get(rank)
        if entry is None:
            self.seen.add(rank)
            return Gate.ADMIT
        if epoch >= entry.epoch:
            return Gate.ADMIT  # a claim of a newer epoch proves nothing and moves nothing
        if pid is not None and pid == entry.pid and pid not in entry.old:
            return Gate.ADMIT  # the bound replica itself, whatever epoch it claims
        self.stale += 1
        return Gate.STALE

    def bind(self, rank: str, epoch: int, pid: int | None) -> Gate:
        """A verified binding of ``rank`` at ``epoch`` (pid of the replica, when known)."""
        entry = self.ranks.get(rank)
        if entry is None:
            self.ranks[rank] = Binding(epoch, pid)
            if rank in self.seen:  # a replica reported before: this binding is a new one
                self.seen.discard(rank)
                return Gate.REBIND
            return Gate.ADMIT
        if epoch < entry.epoch:
            return Gate.ADMIT  # an older binding read late: the newer one stands
        if epoch == entry.epoch:
            if pid is not None:
                entry.pid = pid
            return Gate.ADMIT
        old = entry.old
        if entry.pid is not None and entry.pid != pid and entry.pid not in old:
            old.append(entry.pid)
            if len(old) > OLD_PIDS:
                del old[0]
        entry.epoch = epoch
        entry.pid = pid
        return Gate.REBIND

    def epoch(self, rank: int) -> int | None:
        entry = self.ranks.get(str(rank))
        return None if entry is None else entry.epoch

    def snapshot(self) -> dict[str, Any]:
        return {"ranks": {r: b.doc() for r, b in self.ranks.items()}, "stale": self.stale,
                "seen": sorted(self.seen)}

    def restore(self, doc: dict[str, Any]) -> None:
        self.ranks = {str(k): Binding(int(v[0]), None if v[1] is None else int(v[1]),
                                      [int(p) for p in v[2]])
                      for k, v in doc["ranks"].items()}
        self.stale = int(doc["stale"])
        self.seen = {str(r) for r in doc.get("seen", [])}
