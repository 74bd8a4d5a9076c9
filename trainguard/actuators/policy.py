"""The remediation policy: pure functions from what happened to the commands to issue.

``step(state, event, now_us)`` folds one event (verdict, command, command.outcome, pool.unit,
checkpoint) into the state; ``tick(state, now_us)`` makes the time-driven decisions. Both
return a new state and a list of ``Decision`` (unsigned commands); they never touch the clock,
the bus or a process. The decision service (``decider.py``) does the I/O around them.

The ladder, lightest first:
- a straggler verdict -> tier 1 ``raise_quota`` for the rank's unit (a unit whose backend has
  no quota, ``pool.unit`` ``quota`` false as on Slurm: no command, tier 1 is the wait alone);
  still open ``tier_windows`` windows after that is done -> tier 2: first ``checkpoint_now``
  (the job is still running, so a save now means fewer steps redone after the restart), then,
  once a newer checkpoint is written, its command failed, or ``checkpoint_wait_s`` has passed,
  ``migrate`` to a spare (``checkpoint_wait_s`` 0: migrate at once); still open after as long again
  (counted from when the restarted job loaded its checkpoint: the restart's own fence, launch,
  rendezvous and restore are no window of evidence; without a load, ``outcome_timeout_s``)
  -> tier 3 ``resume`` (the job's process group restarted in place from the last valid
  checkpoint); still open -> ``escalate`` (tiers exhausted).
- a failure verdict (process exit, OOM-killed rank, rank silent, node silent, must-drain XID,
  link down) ->
  ``migrate`` with ``resume`` at once. A job's failure verdicts are collected for ``settle_s``
  first: when a rank dies its synchronous peers exit too (with a peer-lost exit code,
  ``peer_exit_codes``): those exits are consequences, covered by the one restart. An exit whose
  status nobody could read (no code, no signal: under Slurm the agent is not the rank's parent)
  is read by what the rank declared just before it ended (``process.departure``: its code and
  why), and without a declaration it is presumed a consequence too: another failure in the
  window explains it. When none does, the cause is the earliest exit that did not say it lost
  a peer: a rank killed by a signal says nothing, while its peers say they lost it, and which
  exit is read first is a race between nodes.
  A silence verdict that comes ``backlog_lag_s`` after it was decided came from a backlog (the
  agents' spools flushing one after another after a broker outage can make a healthy node
  look silent until its own records arrive): its job's failures are held
  ``backlog_settle_s`` instead, and a silence resolved meanwhile moves nothing. So is an exit
  presumed a consequence (a peer-lost code, or a status nobody could read) read that late:
  its cause may be a silence still on its way (the survivors' exits of a node lost during a
  broker outage, decided on arrival, before the lost node's silence). An exit by a signal is
  its own cause and needs no wait.
  Every rank that failed by itself (a signal, silence) within the window, and every rank bound
  where a node-level verdict points, is moved to a spare by that one ``migrate``
  (``params.ranks``), never onto a unit of a failure domain that just failed
  (``params.avoid_domains``: the located node, and ``pool.failed_domains`` of the failed units).
  When no rank failed by itself, the earliest verdict's rank is the one moved. Verdicts about a
  replica that is no longer the rank's bound one (an older binding epoch; without an epoch,
  another pid: fenced by a restart) are ignored.
- a failure where every rank that failed by itself ended with its own exit code (no signal,
  not a peer-lost code, not 128 + a signal) -> tier 3 ``resume`` in place: the rank's code
  failed, not its unit, and a spare would fail the same way.
- fewer healthy spares than failed ranks -> ``escalate`` saying so: the job is never silently
  shrunk.
- a command that fails, times out, is refused or gets no outcome -> ``escalate``; except a
  restart the actuator refused before changing anything because a unit could not reach the
  job's storage (outcome ``data.retry``): the same command is issued again after a backoff
  (``retry_backoff_s`` doubling up to ``retry_max_backoff_s``, a new idempotency key per
  attempt) until it is done, its verdict resolves, or ``retry_budget_s`` has passed since the
  first refusal -> ``escalate``. Storage that comes back is used without a human. A failure's
  restart is decided afresh at its retry when a silence or a node-level failure opened since
  it was planned (a silence comes last after a broker outage: the refused plan may have moved
  a survivor and kept the lost node, whose storage the actuator could not reach).
- restart-storm guard: ``storm_restarts`` restarts within ``storm_window_s`` without the job's
  checkpoint step moving -> ``escalate`` and stop acting on the job.
- the scheduler ended the job (``job.ended``: a cancel, the time limit, a failed allocation)
  -> stop acting on the job for good, with no command and no escalation: there is nothing
  left to restart it in, and the incident says how it ended (a failed allocation ends it
  unrecoverable, which is told to humans). What is held, waiting or pending for the job is
  dropped. When the scheduler kills every rank at once, the exits come before the actuator's
  word: exits nobody could read and no rank accounted for (no code, no signal, no
  declaration: under Slurm every rank killed by ``scancel``) are all alike, and so are exits
  by SIGTERM, the signal schedulers and launchers stop processes with first (an elastic job's
  workers, stopped by their torchrun agent as ``scancel`` stops it); a job whose held
  failures are only such exits is held ``scheduler_settle_s`` rather than ``settle_s``.
  A rank killed alone is the same kind of exit, but its peers declare they lost it at once,
  and the normal window applies.

Every command's idempotency key is derived from its cause (job, verdict, action, tier), so the
same history gives the same keys: a restarted decision service re-derives them and skips what
it already issued, and the actuator refuses a key it has used.
"""

from __future__ import annotations

import copy
import math
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from trainguard.actuators.pool import (
    Domain,
    PoolState,
    Unit,
    domains,
    failed_domains,
    format_domains,
    reduce,
)
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    ActionParams,
    CheckpointAction,
    CheckpointEvent,
    CheckpointNowParams,
    Command,
    CommandAction,
    CommandOutcome,
    DepartureCause,
    EscalateParams,
    ExitEvidence,
    JobEnded,
    MigrateParams,
    OutcomeStatus,
    Payload,
    PoolUnit,
    RaiseQuotaParams,
    ResumeParams,
    SchedulerEnd,
    Verdict,
    VerdictClass,
    VerdictKind,
    VerdictState,
)

# what ``step`` folds (every other event leaves the state as it is): decide reads these types
INPUTS: tuple[type[Payload], ...] = (Verdict, Command, CommandOutcome, PoolUnit, CheckpointEvent,
                                     JobEnded)
RESTARTS = frozenset({CommandAction.MIGRATE, CommandAction.RESUME})
FINAL = frozenset({OutcomeStatus.DONE, OutcomeStatus.FAILED, OutcomeStatus.TIMED_OUT,
                   OutcomeStatus.REFUSED})
ESCALATION_TIER = 0  # a human
# judged by the absence of records: wrong while records are still on their way (backlog)
SILENCE_KINDS = frozenset({VerdictKind.RANK_SILENT, VerdictKind.NODE_SILENT})


@dataclass(frozen=True)
class PolicyConfig:
    window_s: float = 5.0
    tier_windows: int = 2  # M: windows a tier gets before the next one
    settle_s: float = 1.0
    # A silence verdict (rank or node) read more than backlog_lag_s after it was decided came
    # from a backlog: the streams were catching up, e.g. after a broker outage, when the
    # agents' spools flush one after the other and the job's watermark runs ahead of a node
    # whose agent has not flushed yet. Its job's failures are then held backlog_settle_s
    # (from its reading) instead of settle_s, for the records still on their way to resolve it.
    backlog_lag_s: float = 5.0
    backlog_settle_s: float = 15.0
    quota_pct: float | None = None  # tier-1 target quota (None: no limit)
    storm_restarts: int = 3  # N
    storm_window_s: float = 600.0  # T
    outcome_timeout_s: float = 180.0
    retry_backoff_s: float = 5.0  # first wait before retrying a retryable refused restart
    retry_max_backoff_s: float = 60.0
    retry_budget_s: float = 600.0  # since the first refusal; then escalate
    checkpoint_wait_s: float = 30.0  # a straggler's save before its migration (0: no save)
    issued_by: str = "trainguard-decide"
    # exit codes (without a signal) by which a rank says it left because a peer was lost: a
    # consequence of another rank's failure, not a fault of its own unit (3: the reference
    # workload's EXIT_PEER_LOST)
    peer_exit_codes: tuple[int, ...] = (3,)
    # a job whose held failures are only exits nobody accounted for waits this long for the
    # actuator's word that the scheduler ended it (its watch polls about every second)
    scheduler_settle_s: float = 5.0

    def __post_init__(self) -> None:
        for name in ("window_s", "settle_s", "backlog_lag_s", "backlog_settle_s",
                     "scheduler_settle_s",
                     "storm_window_s", "outcome_timeout_s",
                     "retry_backoff_s", "retry_max_backoff_s", "retry_budget_s",
                     "checkpoint_wait_s"):
            value = getattr(self, name)
            if not 0 <= value < math.inf:  # NaN too: a tick would fail on it every time
                raise ValueError(f"{name}: must be >= 0 and finite (got {value})")
        if self.tier_windows < 1:
            raise ValueError(f"tier_windows: must be >= 1 (got {self.tier_windows})")
        if self.storm_restarts < 1:
            raise ValueError(f"storm_restarts: must be >= 1 (got {self.storm_restarts})")


@dataclass(frozen=True)
class Decision:
    job_id: str
    subject: Subject
    command: Command  # unsigned


@dataclass
class OpenVerdict:
    verdict_id: str
    job: str
    kind: VerdictKind
    rank: int | None
    node: str | None
    gpu: int | None
    first_time: int
    pid: int | None
    exit_code: int | None = None
    signal: int | None = None
    epoch: int | None = None  # the binding the exit was matched to (its fencing token)
    decided_at: int | None = None  # the verdict's event time (when the rule decided it)
    declared_code: int | None = None  # what the rank said it was leaving with, and why
    declared_cause: DepartureCause | None = None


@dataclass
class Ladder:
    job: str
    rank: int
    verdict_id: str
    tier: int
    key: str | None  # the current tier's command (None: tier 1 without one, no quota)
    done_at: int | None = None  # when the current tier's command was done
    restoring: bool = False  # its restart is done; its windows start at the checkpoint load
    saving: Saving | None = None  # tier 2's save before the migration, under way


@dataclass
class Saving:
    key: str  # the checkpoint_now command
    since: int
    ckpt_before: int  # the job's newest checkpoint step when it was asked
    ended: bool = False  # its command failed: migrate without waiting


@dataclass
class Pending:
    key: str
    job: str
    action: CommandAction
    tier: int
    issued_at: int
    rank: int | None
    cause: str = ""
    params: ActionParams = field(default_factory=EscalateParams)
    attempt: int = 0  # retries before this one
    retry_since: int | None = None  # when the first attempt was refused


@dataclass
class Retry:
    """A refused restart (its ``retry_since`` set) to issue again at ``due_at``."""
    pending: Pending
    due_at: int


@dataclass
class PolicyState:
    pool: PoolState = field(default_factory=PoolState)
    open: dict[str, OpenVerdict] = field(default_factory=dict)
    ladders: dict[str, Ladder] = field(default_factory=dict)  # "job/rank"
    held: dict[str, list[OpenVerdict]] = field(default_factory=dict)  # job -> failures
    held_since: dict[str, int] = field(default_factory=dict)
    held_until: dict[str, int] = field(default_factory=dict)  # a backlog silence: not before
    pending: dict[str, Pending] = field(default_factory=dict)  # idempotency key
    issued: set[str] = field(default_factory=set)
    restarts: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # (time, ckpt)
    ckpt_step: dict[str, int] = field(default_factory=dict)
    stopped: dict[str, str] = field(default_factory=dict)  # job -> why
    retries: dict[str, Retry] = field(default_factory=dict)  # job -> its refused restart
    ended: dict[str, SchedulerEnd] = field(default_factory=dict)  # job -> how its allocation ended


def step(state: PolicyState, event: Event, now_us: int,
         cfg: PolicyConfig) -> tuple[PolicyState, list[Decision]]:
    s = _copy(state)
    out: list[Decision] = []
    p = event.payload
    if isinstance(p, Verdict):
        _on_verdict(s, event, p, now_us, cfg, out)
    elif isinstance(p, Command):
        s.issued.add(p.idempotency_key)
    elif isinstance(p, CommandOutcome):
        _on_outcome(s, event.job_id, p, now_us, cfg, out)
    elif isinstance(p, PoolUnit):
        s.pool = reduce(s.pool, event)
    elif isinstance(p, JobEnded):
        _job_ended(s, event.job_id, p)
    elif isinstance(p, CheckpointEvent) and p.action in (CheckpointAction.WRITTEN,
                                                         CheckpointAction.LOADED):
        s.ckpt_step[event.job_id] = max(s.ckpt_step.get(event.job_id, -1), p.step)
        if p.action is CheckpointAction.LOADED:
            _restored(s, event.job_id, now_us)
    return s, out


def tick(state: PolicyState, now_us: int, cfg: PolicyConfig) -> tuple[PolicyState, list[Decision]]:
    s = _copy(state)
    out: list[Decision] = []
    for job in sorted(s.held):
        settle = cfg.scheduler_settle_s if all(map(_stop_request, s.held[job])) else \
            cfg.settle_s
        if now_us - s.held_since[job] >= int(settle * 1e6) and now_us >= s.held_until.get(job, 0):
            _decide_failure(s, job, s.held.pop(job), now_us, cfg, out)
            del s.held_since[job]
            s.held_until.pop(job, None)
    wait = int(cfg.window_s * cfg.tier_windows * 1e6)
    for name in sorted(s.ladders):
        lad = s.ladders[name]
        if lad.saving is not None:
            if _saved(s, lad.job, lad.saving, now_us, cfg):
                lad.saving = None
                _next_tier(s, lad, now_us, cfg, out)
            continue
        if lad.done_at is None or now_us - lad.done_at < wait or lad.verdict_id not in s.open:
            continue
        if lad.restoring and now_us - lad.done_at < int(cfg.outcome_timeout_s * 1e6):
            continue  # the restarted job has not loaded its checkpoint yet
        if lad.tier == 1 and cfg.checkpoint_wait_s > 0 and lad.job not in s.stopped:
            key = _issue(s, lad.job, 2, lad.verdict_id, CheckpointNowParams(
                rank=lad.rank, reason="straggler: save before migrating"), now_us, cfg, out)
            if key is not None:
                # best effort, never escalated: its ladder follows it, not the pending table
                del s.pending[key]
                lad.saving = Saving(key, now_us, s.ckpt_step.get(lad.job, -1))
                continue
        _next_tier(s, lad, now_us, cfg, out)
    for job in sorted(s.retries):
        if now_us >= s.retries[job].due_at:
            _retry(s, s.retries.pop(job), now_us, cfg, out)
    timeout = int(cfg.outcome_timeout_s * 1e6)
    for key in sorted(s.pending):
        pend = s.pending[key]
        if pend.action is not CommandAction.ESCALATE and now_us - pend.issued_at > timeout:
            del s.pending[key]
            _escalate(s, pend.job, f"no final outcome for {pend.action.value} (tier "
                      f"{pend.tier}) within {cfg.outcome_timeout_s:.0f} s", key, pend.rank,
                      now_us, cfg, out)
    return s, out


def _job_ended(s: PolicyState, job: str, e: JobEnded) -> None:
    """The scheduler ended the job's allocation: nothing more is done for the job."""
    s.ended[job] = e.end
    s.stopped.setdefault(job, f"the scheduler ended the job ({e.state})")
    s.held.pop(job, None)
    s.held_since.pop(job, None)
    s.held_until.pop(job, None)
    s.retries.pop(job, None)
    for name in [n for n, lad in s.ladders.items() if lad.job == job]:
        del s.ladders[name]
    for key in [k for k, pend in s.pending.items() if pend.job == job]:
        del s.pending[key]


def _restored(s: PolicyState, job: str, now_us: int) -> None:
    """The job loaded a checkpoint: a ladder whose restart was done counts its windows from
    now (the first rank's load; the others' change nothing)."""
    for lad in s.ladders.values():
        if lad.job == job and lad.restoring:
            lad.done_at, lad.restoring = max(lad.done_at or now_us, now_us), False


def _saved(s: PolicyState, job: str, saving: Saving, now_us: int, cfg: PolicyConfig) -> bool:
    """Has the save before a migration ended: a newer checkpoint, its command failed, or its
    time is up?"""
    return (saving.ended or s.ckpt_step.get(job, -1) > saving.ckpt_before
            or now_us - saving.since >= int(cfg.checkpoint_wait_s * 1e6))


def _copy(state: PolicyState) -> PolicyState:
    """A private copy to change; the pool is immutable and shared."""
    return copy.deepcopy(state, memo={id(state.pool): state.pool})


# --- verdicts ------------------------------------------------------------------------------


def _on_verdict(s: PolicyState, event: Event, v: Verdict, now_us: int, cfg: PolicyConfig,
                out: list[Decision]) -> None:
    job = event.job_id
    if v.state is VerdictState.RESOLVED:
        s.open.pop(v.verdict_id, None)
        for name in [n for n, lad in s.ladders.items() if lad.verdict_id == v.verdict_id]:
            del s.ladders[name]  # back among its peers: the ladder stops here
        return
    ex = ExitEvidence.of(v.evidence)
    ov = OpenVerdict(v.verdict_id, job, v.kind, event.subject.rank, event.subject.node,
                     event.subject.gpu, v.first_anomalous_time, ex.pid, ex.exit_code, ex.signal,
                     ex.binding_epoch, event.event_time, ex.declared_code, ex.declared_cause)
    if v.verdict_id in s.open:
        return
    s.open[v.verdict_id] = ov
    if job in s.stopped:
        return
    ON_OPEN[v.kind.verdict_class](s, ov, now_us, cfg, out)


def _open_ladder(s: PolicyState, ov: OpenVerdict, now_us: int, cfg: PolicyConfig,
                 out: list[Decision]) -> None:
    if ov.rank is None:
        return
    job = ov.job
    name = f"{job}/{ov.rank}"
    if name in s.ladders or _restart_pending(s, job):
        return
    unit = s.pool.bound(job).get(ov.rank)
    if unit is not None and not unit.quota:
        # no quota to raise (Slurm): tier 1 is a watch with no command; the verdict must stay
        # open as long as after a done tier 1 before tier 2 moves the rank
        s.ladders[name] = Ladder(job, ov.rank, ov.verdict_id, 1, None, done_at=now_us)
        return
    params = RaiseQuotaParams(rank=ov.rank, quota_pct=cfg.quota_pct,
                              unit=unit.name if unit else None, reason=ov.kind)
    d = _issue(s, job, 1, ov.verdict_id, params, now_us, cfg, out)
    if d is not None:
        s.ladders[name] = Ladder(job, ov.rank, ov.verdict_id, 1, d)


def _hold_failure(s: PolicyState, ov: OpenVerdict, now_us: int, cfg: PolicyConfig,
                  out: list[Decision]) -> None:
    waiting = s.retries.get(ov.job)
    if waiting is not None and _late_failures(s, waiting.pending):
        # the refused restart will be decided afresh with it: no need to wait out its backoff
        waiting.due_at = min(waiting.due_at, now_us + int(cfg.settle_s * 1e6))
    if _stale(s, ov) or _restart_pending(s, ov.job):
        return  # a replica already replaced, or covered by the restart under way
    s.held.setdefault(ov.job, []).append(ov)
    s.held_since.setdefault(ov.job, now_us)
    if ((ov.kind in SILENCE_KINDS or _consequence(ov, cfg)) and ov.decided_at is not None
            and now_us - ov.decided_at > int(cfg.backlog_lag_s * 1e6)):
        s.held_until[ov.job] = max(s.held_until.get(ov.job, 0),
                                   now_us + int(cfg.backlog_settle_s * 1e6))


def _record_only(s: PolicyState, ov: OpenVerdict, now_us: int, cfg: PolicyConfig,
                 out: list[Decision]) -> None:
    """An info verdict: open (it may be a command's cause) but never acted on."""


# What an open verdict of each class starts: every class has an entry (a test checks that
# every kind a rule can emit has one).
ON_OPEN: Mapping[VerdictClass, Callable[[PolicyState, OpenVerdict, int, PolicyConfig,
                                         list[Decision]], None]] = {
    VerdictClass.LADDER: _open_ladder,
    VerdictClass.FAILURE: _hold_failure,
    VerdictClass.INFO: _record_only,
}


def _stale(s: PolicyState, ov: OpenVerdict) -> bool:
    """About a replica the rank's binding has since replaced? The binding epoch decides when
    the verdict carries one; else the pid. (A Slurm unit's pid is its ``srun`` on the head,
    never the rank's own pid on the node: only the epoch can tell there.)"""
    if ov.rank is None:
        return False
    unit = s.pool.bound(ov.job).get(ov.rank)
    if unit is None:
        return False
    if ov.epoch is not None and unit.epoch is not None:
        return ov.epoch < unit.epoch
    return ov.pid is not None and unit.pid is not None and unit.pid != ov.pid


def _restart_pending(s: PolicyState, job: str) -> bool:
    return job in s.retries or any(p.job == job and p.action in RESTARTS
                                   for p in s.pending.values())


def _decide_failure(s: PolicyState, job: str, held: list[OpenVerdict], now_us: int,
                    cfg: PolicyConfig, out: list[Decision], attempt: int = 0,
                    retry_since: int | None = None) -> None:
    live = [ov for ov in held if ov.verdict_id in s.open and not _stale(s, ov)]
    if not live or job in s.stopped or _restart_pending(s, job):
        return
    first = min(live, key=lambda ov: (_blames_a_peer(ov, cfg), *_order(ov)))
    own = [ov for ov in live if not _consequence(ov, cfg)]
    group = sorted(own, key=_order) if own else [first]  # the ranks that failed by themselves
    cause = group[0]
    if own and all(_software_exit(ov, cfg) for ov in own) and cause.rank is not None:
        # the rank's own code failed (an exit code, no signal): its unit is fine and a spare
        # would fail the same way; restart in place from the last valid checkpoint
        _issue(s, job, 3, cause.verdict_id, ResumeParams(rank=cause.rank, reason=cause.kind),
               now_us, cfg, out, attempt, retry_since)
        return
    bound = s.pool.bound(job)
    ranks: set[int] = set()
    avoid: set[Domain] = set()
    for ov in group:
        if ov.rank is not None:
            ranks.add(ov.rank)
            continue
        ranks |= _ranks_on(s, job, ov)  # a node/GPU-level verdict: every rank bound there
        if ov.node is not None and ov.gpu is None:
            avoid.add(("node", ov.node))
    covered = [ov.verdict_id for ov in live if ov is not cause]
    if not ranks:
        _escalate(s, job, f"{cause.kind} at node {cause.node} gpu {cause.gpu}: no rank of the "
                  "job is bound there to move", cause.verdict_id, None, now_us, cfg, out)
        return
    failed = [bound[r] for r in sorted(ranks) if r in bound]
    survivors = [u for r, u in bound.items() if r not in ranks]
    avoid |= failed_domains(s.pool, failed, survivors)
    rank = cause.rank if cause.rank is not None else min(ranks)
    _migrate_or_escalate(s, job, rank, cause.verdict_id, cause.kind, 2, now_us, cfg, out,
                         covered=covered, ranks=sorted(ranks), avoid=frozenset(avoid),
                         attempt=attempt, retry_since=retry_since)


def _order(ov: OpenVerdict) -> tuple[int, str]:
    return ov.first_time, ov.verdict_id


def _code(ov: OpenVerdict) -> int | None:
    """The exit code read, else the one the rank declared before it ended."""
    return ov.exit_code if ov.exit_code is not None else ov.declared_code


def _blames_a_peer(ov: OpenVerdict, cfg: PolicyConfig) -> bool:
    """An exit that says it happened because a peer was lost: a peer-lost code (read, else
    declared), or a declaration whose cause is ``peer_lost`` that the status read (if any)
    bears out (the same code: a process that declared and then ended otherwise is judged by
    how it ended)."""
    declared = ov.declared_cause is DepartureCause.PEER_LOST and (
        ov.exit_code is None or ov.exit_code == ov.declared_code)
    return (ov.kind is VerdictKind.PROCESS_EXIT and ov.signal is None
            and (_code(ov) in cfg.peer_exit_codes or declared))


def _consequence(ov: OpenVerdict, cfg: PolicyConfig) -> bool:
    """A rank that left because a peer was lost (its own unit did not fail), or presumed so:
    an exit with neither code nor signal is one whose status could not be read, and that the
    rank did not account for itself."""
    return (ov.kind is VerdictKind.PROCESS_EXIT and ov.signal is None
            and (_code(ov) is None or _blames_a_peer(ov, cfg)))


def _unaccounted(ov: OpenVerdict) -> bool:
    """An exit nobody could read that the rank did not account for: no code, no signal, no
    declaration (under Slurm, a rank killed by a signal, ``scancel`` among them)."""
    return (ov.kind is VerdictKind.PROCESS_EXIT and ov.signal is None and _code(ov) is None
            and ov.declared_cause is None)


def _stop_request(ov: OpenVerdict) -> bool:
    """An exit that may be a deliberate stop whose word is on its way: unaccounted (above),
    or by SIGTERM (what ``scancel``, a preemption or a torchrun agent shutting down sends
    first; a crash is seldom one). Only the wait for that word is longer; the decision after
    it is the usual one."""
    return _unaccounted(ov) or (ov.kind is VerdictKind.PROCESS_EXIT
                                and ov.signal == signal.SIGTERM)


def _software_exit(ov: OpenVerdict, cfg: PolicyConfig) -> bool:
    """A rank that ended itself with an error code (an exception, an assertion): no signal, a
    code read (or, unread, declared as its own error), neither 0 nor a peer-lost code, nor
    129-192 (128 + a signal: how a shell or a launcher in between reports a child killed by
    one)."""
    code = _code(ov)
    return (ov.kind is VerdictKind.PROCESS_EXIT and ov.signal is None and code is not None
            and not _blames_a_peer(ov, cfg) and code != 0 and not 128 < code <= 192)


def _ranks_on(s: PolicyState, job: str, ov: OpenVerdict) -> set[int]:
    return {rank for rank, unit in s.pool.bound(job).items()
            if unit.node == ov.node and (ov.gpu is None
                                         or unit.labels.get("gpu") in (None, str(ov.gpu)))}


def healthy_spares(s: PolicyState, job: str, avoid: frozenset[Domain]) -> list[Unit]:
    """The job's spares outside every failed domain (reachability is the actuator's check)."""
    return [u for u in s.pool.spares_for(job) if not domains(u) & avoid]


def _migrate_or_escalate(s: PolicyState, job: str, rank: int, cause: str, reason: str,
                         tier: int, now_us: int, cfg: PolicyConfig, out: list[Decision],
                         covered: list[str] | None = None, ranks: list[int] | None = None,
                         avoid: frozenset[Domain] = frozenset(), attempt: int = 0,
                         retry_since: int | None = None) -> str | None:
    moving = ranks or [rank]
    spares = healthy_spares(s, job, avoid)
    if len(spares) < len(moving):
        where = (f" outside the failed domain(s) {', '.join(format_domains(avoid))}"
                 if avoid else "")
        what = (f"at rank {rank}" if len(moving) == 1 else
                f"at ranks {moving} together ({len(moving)} ranks to move, {len(spares)} "
                f"healthy spare(s))")
        _escalate(s, job, f"{reason} {what}: "
                  f"{'no spare unit' if not spares else 'not enough spare units'} in the pool "
                  f"for job {job}{where}; the job is not shrunk, a human must add capacity or "
                  "decide", cause, rank, now_us, cfg, out)
        return None
    bound = s.pool.bound(job)
    unit = bound.get(rank)
    params = MigrateParams(rank=rank, resume=True, reason=reason,
                           from_unit=unit.name if unit else None, ranks=list(moving),
                           from_units=[bound[r].name if r in bound else None for r in moving],
                           avoid_domains=list(format_domains(avoid)),
                           covered_verdicts=list(covered or []))
    return _issue(s, job, tier, cause, params, now_us, cfg, out, attempt, retry_since)


def _next_tier(s: PolicyState, lad: Ladder, now_us: int, cfg: PolicyConfig,
               out: list[Decision]) -> None:
    name = f"{lad.job}/{lad.rank}"
    if lad.job in s.stopped:
        del s.ladders[name]
        return
    if lad.tier == 1:
        key = _migrate_or_escalate(s, lad.job, lad.rank, lad.verdict_id,
                                   VerdictKind.STRAGGLER, 2, now_us, cfg, out)
    elif lad.tier == 2:
        key = _issue(s, lad.job, 3, lad.verdict_id,
                     ResumeParams(rank=lad.rank, reason=VerdictKind.STRAGGLER), now_us, cfg, out)
    else:
        _escalate(s, lad.job, f"straggler at rank {lad.rank}: still slow after tiers 1-3",
                  lad.verdict_id, lad.rank, now_us, cfg, out)
        key = None
    if key is None:
        del s.ladders[name]
    else:
        lad.tier, lad.key, lad.done_at = lad.tier + 1, key, None


# --- outcomes ------------------------------------------------------------------------------


def _on_outcome(s: PolicyState, job: str, o: CommandOutcome, now_us: int, cfg: PolicyConfig,
                out: list[Decision]) -> None:
    if o.status not in FINAL:
        return
    for lad in s.ladders.values():
        if lad.saving is not None and lad.saving.key == o.idempotency_key:
            # a save is best effort: failed (e.g. the rank takes no save requests), the
            # migration goes on from the last checkpoint; done, it waits for the checkpoint
            lad.saving.ended = o.status is not OutcomeStatus.DONE
            return
    pend = s.pending.pop(o.idempotency_key, None)
    if pend is None:
        return
    at = o.finished_at or now_us
    ladder = next((lad for lad in s.ladders.values() if lad.key == o.idempotency_key), None)
    if o.status is not OutcomeStatus.DONE:
        what = f"{o.status.value}: {o.detail}"
        if _retryable(pend, o) and job not in s.stopped:
            since = pend.retry_since if pend.retry_since is not None else at
            if now_us - since < int(cfg.retry_budget_s * 1e6):
                wait = min(cfg.retry_max_backoff_s, cfg.retry_backoff_s * 2 ** pend.attempt)
                s.retries[job] = Retry(replace(pend, retry_since=since),
                                       now_us + int(wait * 1e6))
                return
            what = (f"refused {pend.attempt + 1} times over {(now_us - since) / 1e6:.0f} s, "
                    f"the last: {o.detail}")
        if ladder is not None:
            del s.ladders[f"{ladder.job}/{ladder.rank}"]
        if pend.action is not CommandAction.ESCALATE:
            _escalate(s, job, f"{pend.action.value} (tier {pend.tier}) {what}",
                      o.idempotency_key, pend.rank, now_us, cfg, out)
        return
    if ladder is not None:
        ladder.done_at, ladder.restoring = at, pend.action in RESTARTS
    if pend.action in RESTARTS:
        history = [(t, c) for t, c in s.restarts.get(job, [])
                   if at - t <= int(cfg.storm_window_s * 1e6)]
        history.append((at, s.ckpt_step.get(job, -1)))
        s.restarts[job] = history
        if len(history) >= cfg.storm_restarts and len({c for _, c in history}) == 1:
            s.stopped[job] = "restart storm"
            _escalate(s, job, f"restart storm: {len(history)} restarts within "
                      f"{cfg.storm_window_s:.0f} s without checkpoint progress (step "
                      f"{history[-1][1]}); remediation stopped for this job",
                      o.idempotency_key, pend.rank, now_us, cfg, out)


def _retryable(pend: Pending, o: CommandOutcome) -> bool:
    """A restart refused before it changed anything, for a condition that may clear."""
    return (pend.action in RESTARTS and o.status is OutcomeStatus.FAILED
            and o.retry is not None)


def _retry(s: PolicyState, r: Retry, now_us: int, cfg: PolicyConfig,
           out: list[Decision]) -> None:
    """Issue a refused restart again, unless its job stopped or its verdict resolved; decided
    afresh when a silence or a node-level failure opened since it was planned."""
    p = r.pending
    if p.job in s.stopped or p.cause not in s.open:
        return
    late = _late_failures(s, p)
    if late:
        planned = [s.open[v] for v in (p.cause, *_covered(p)) if v in s.open]
        _decide_failure(s, p.job, planned + late, now_us, cfg, out, p.attempt + 1,
                        p.retry_since)
        return
    key = _issue(s, p.job, p.tier, p.cause, p.params, now_us, cfg, out,
                 attempt=p.attempt + 1, retry_since=p.retry_since)
    for lad in s.ladders.values():
        if key is not None and lad.key == p.key:
            lad.key = key  # the ladder waits for this attempt now


def _covered(p: Pending) -> list[str]:
    return p.params.covered_verdicts if isinstance(p.params, MigrateParams) else []


def _late_failures(s: PolicyState, p: Pending) -> list[OpenVerdict]:
    """Failures a refused restart's plan could not know: silences and node-level verdicts
    opened since (dropped meanwhile as covered by the restart under way). A silence is judged
    by the absence of records, so after a broker outage it comes last, after the exits it
    explains: the refused plan moved the wrong rank and kept one on the lost node (whose
    storage the actuator could not reach: the refusal). Only for a restart a failure caused;
    an exit that came meanwhile is covered by the retry as before."""
    cause = s.open.get(p.cause)
    if cause is None or cause.kind.verdict_class is not VerdictClass.FAILURE:
        return []
    named = {p.cause, *_covered(p)}
    return sorted((ov for ov in s.open.values()
                   if ov.job == p.job and ov.verdict_id not in named
                   and ov.kind.verdict_class is VerdictClass.FAILURE
                   and (ov.kind in SILENCE_KINDS or ov.rank is None) and not _stale(s, ov)),
                  key=_order)


# --- commands ------------------------------------------------------------------------------


def _escalate(s: PolicyState, job: str, reason: str, cause: str, rank: int | None,
              now_us: int, cfg: PolicyConfig, out: list[Decision]) -> None:
    if job in s.ended:
        return  # the scheduler ended it: no human is called about a job that is over
    _issue(s, job, ESCALATION_TIER, cause, EscalateParams(reason=reason, rank=rank), now_us, cfg,
           out)


def idempotency_key(job: str, cause: str, action: CommandAction, tier: int,
                    attempt: int = 0) -> str:
    if attempt == 0:
        return derived_id("command-key", job, cause, action.value, tier)
    return derived_id("command-key", job, cause, action.value, tier, attempt)


def _issue(s: PolicyState, job: str, tier: int, cause: str, params: ActionParams,
           now_us: int, cfg: PolicyConfig, out: list[Decision], attempt: int = 0,
           retry_since: int | None = None) -> str | None:
    """Issue the command of ``params`` (its action and rank are the params'), unless the key
    its cause derives was issued already."""
    action, rank = params.action, params.rank
    key = idempotency_key(job, cause, action, tier, attempt)
    if key in s.issued:
        return None
    s.issued.add(key)
    s.pending[key] = Pending(key, job, action, tier, now_us, rank, cause, params, attempt,
                             retry_since)
    cmd = Command(command_id=derived_id("command", key), idempotency_key=key, action=action,
                  tier=tier, issued_at=now_us, issued_by=cfg.issued_by,
                  cause_verdict_ids=[cause] if cause in s.open else [], params=params)
    out.append(Decision(job, Subject(rank=rank), cmd))
    return key
