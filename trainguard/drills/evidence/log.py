"""An index over one job's events for the checks: step reports by rank and epoch, the
injection window, checkpoints, pool bindings. Pure."""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainguard.events.envelope import Event
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    Command,
    CommandOutcome,
    Heartbeat,
    IncidentTransition,
    Injection,
    OutcomeStatus,
    PoolUnit,
    ProcessExit,
    ReplicaRefused,
    StepReport,
    UnitState,
    Verdict,
    VerdictState,
)


@dataclass(frozen=True)
class Step:
    event_id: str
    time: int
    rank: int
    epoch: int
    step: int
    samples: int
    loss: float | None
    pid: int | None
    # the rank's data shard, whose loss it reports: its data-parallel rank when it says one
    # (an elastic job's slot is fed the shard of the process-group rank the rendezvous gave
    # it), else the rank
    shard: int = 0


@dataclass
class JobLog:
    job_id: str
    steps: list[Step] = field(default_factory=list)
    heartbeats: list[Event] = field(default_factory=list)
    injections: list[Event] = field(default_factory=list)
    checkpoints: list[Event] = field(default_factory=list)
    units: list[Event] = field(default_factory=list)
    exits: list[Event] = field(default_factory=list)
    refused: list[Event] = field(default_factory=list)
    verdicts: list[Event] = field(default_factory=list)
    commands: list[Event] = field(default_factory=list)
    outcomes: list[Event] = field(default_factory=list)
    incidents: list[Event] = field(default_factory=list)

    # --- the fault window -----------------------------------------------------------------

    def fault_start(self) -> int | None:
        starts = [e.event_time for e in self.injections
                  if isinstance(e.payload, Injection) and e.payload.phase == "start"]
        return min(starts) if starts else None

    def fault_end(self) -> int | None:
        """The fault's stop or rollback, else its start (a one-shot fault)."""
        ends = [e.event_time for e in self.injections
                if isinstance(e.payload, Injection) and e.payload.phase in ("stop", "rollback")]
        if ends:
            return max(ends)
        return self.fault_start()

    # --- steps ----------------------------------------------------------------------------

    def by_rank_epoch(self) -> dict[tuple[int, int], list[Step]]:
        out: dict[tuple[int, int], list[Step]] = defaultdict(list)
        for s in self.steps:
            out[(s.rank, s.epoch)].append(s)
        for v in out.values():
            v.sort(key=lambda s: (s.step, s.time))
        return dict(out)

    def ranks(self) -> list[int]:
        return sorted({s.rank for s in self.steps})

    def epoch_before(self, t: int) -> int | None:
        """The binding epoch the job ran at just before ``t`` (the highest seen before it)."""
        before = [s.epoch for s in self.steps if s.time < t]
        return max(before) if before else None

    def global_batch(self) -> int | None:
        """Samples per step, job-wide: the most common increase between consecutive steps."""
        diffs: Counter[int] = Counter()
        for seq in self.by_rank_epoch().values():
            for a, b in itertools.pairwise(seq):
                if b.step == a.step + 1:
                    diffs[b.samples - a.samples] += 1
        return diffs.most_common(1)[0][0] if diffs else None

    # --- checkpoints ----------------------------------------------------------------------

    def ckpt(self, action: CheckpointAction, before: int | None = None) -> list[Event]:
        return [e for e in self.checkpoints if isinstance(e.payload, CheckpointEvent)
                and e.payload.action is action and (before is None or e.event_time < before)]

    # --- the pool -------------------------------------------------------------------------

    def unit_events(self, state: UnitState) -> list[Event]:
        return [e for e in self.units if isinstance(e.payload, PoolUnit)
                and e.payload.state is state]

    def opened_verdicts(self) -> list[Event]:
        return [e for e in self.verdicts if isinstance(e.payload, Verdict)
                and e.payload.state is VerdictState.OPEN]

    def done_actions(self) -> list[tuple[Event, Event]]:
        """(command, its done outcome) pairs."""
        cmds = {e.payload.command_id: e for e in self.commands if isinstance(e.payload, Command)}
        out = []
        for o in self.outcomes:
            p = o.payload
            if isinstance(p, CommandOutcome) and p.status is OutcomeStatus.DONE \
                    and p.command_id in cmds:
                out.append((cmds[p.command_id], o))
        return out


def index(events: Sequence[Event], job_id: str) -> JobLog:
    """One job's events, by kind, in event-time order, each event id once: delivery is at
    least once (an agent whose send was cut off before its ack sends it again from its spool:
    the 2026-12-06 head-partition drill logged two step reports twice), and every reader
    deduplicates by event id."""
    log = JobLog(job_id)
    seen: set[str] = set()
    for e in sorted(events, key=lambda e: (e.event_time, e.event_id)):
        if e.job_id != job_id or e.event_id in seen:
            continue
        seen.add(e.event_id)
        p = e.payload
        if isinstance(p, StepReport):
            log.steps.append(Step(e.event_id, e.event_time, p.rank, p.binding_epoch, p.step,
                                  p.samples_consumed, p.loss, p.pid,
                                  p.rank if p.dp_rank is None else p.dp_rank))
        elif isinstance(p, Heartbeat):
            log.heartbeats.append(e)
        elif isinstance(p, Injection):
            log.injections.append(e)
        elif isinstance(p, CheckpointEvent):
            log.checkpoints.append(e)
        elif isinstance(p, PoolUnit):
            log.units.append(e)
        elif isinstance(p, ProcessExit):
            log.exits.append(e)
        elif isinstance(p, ReplicaRefused):
            log.refused.append(e)
        elif isinstance(p, Verdict):
            log.verdicts.append(e)
        elif isinstance(p, Command):
            log.commands.append(e)
        elif isinstance(p, CommandOutcome):
            log.outcomes.append(e)
        elif isinstance(p, IncidentTransition):
            log.incidents.append(e)
    return log
