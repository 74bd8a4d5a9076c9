"""A realistic, deterministic event log for tests, benchmarks and the docs: a 4-rank job with a
throttled rank fixed by tier 1, then a killed rank migrated to a spare and the job resumed from
its last checkpoint. Observations are built here; the verdicts come from the real rule engine
(fed as the live streams worker is: no final flush), and the decisions (commands, outcomes,
pool events) stand in for the actuator's, naming those verdicts."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    ActionParams,
    CheckpointAction,
    CheckpointEvent,
    Command,
    CommandOutcome,
    GpuSample,
    Injection,
    MigrateParams,
    NicSample,
    NodeTelemetry,
    OutcomeStatus,
    Payload,
    PeerPath,
    PoolUnit,
    ProcessExit,
    RaiseQuotaParams,
    ResumeParams,
    StepReport,
    UnitState,
    Verdict,
    VerdictKind,
    VerdictState,
)
from trainguard.incidents.model import order_key
from trainguard.rules import RuleEngine, RuleSet, load_default_rules

T0 = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
MS = 1_000
S = 1_000_000
STEP_US = 200 * MS
BATCH = 32
SRC = "synth.incident"


@dataclass(frozen=True)
class Scenario:
    job: str = "job-a"
    ranks: int = 4
    node: str = "node-a"
    spare_node: str = "node-b"
    slow_rank: int = 2
    slow_steps: tuple[int, int] = (40, 60)  # throttled from..to (tier 1 fixes it at the end)
    kill_rank: int = 3
    kill_after_step: int = 120
    checkpoint_every: int = 50
    resume_steps: int = 40
    recovery_us: int = 3 * S  # kill -> first step after the resume
    # True: the actuator's local backend shape - every rank fenced and bound again at a new
    # epoch; False: only the killed rank moves (epoch 1), the others keep running
    restart_all: bool = False
    # True: the killed rank's synchronous peers exit in the same instant (code 3, peer lost),
    # as an agent that sees every exit in one pass reports them
    peer_exits: bool = False

    def step_time(self, step: int, rank: int) -> int:
        return T0 + step * STEP_US + rank * 10 * MS

    @property
    def kill_time(self) -> int:
        return self.step_time(self.kill_after_step, 0) + 100 * MS

    @property
    def last_checkpoint(self) -> int:
        return (self.kill_after_step // self.checkpoint_every) * self.checkpoint_every


def _ev(payload: Payload, job: str, t: int, key: Iterable[object], subject: Subject | None = None,
        source: str = SRC) -> Event:
    return make_event(payload, event_id=derived_id(SRC, *key), job_id=job, event_time=t,
                      source=source, subject=subject)


def observations(sc: Scenario) -> list[Event]:
    """What the agents and the trainer report: steps, checkpoints, the exit, telemetry, drills."""
    out: list[Event] = []
    for step in range(sc.kill_after_step + 1):
        for rank in range(sc.ranks):
            slow = rank == sc.slow_rank and sc.slow_steps[0] <= step < sc.slow_steps[1]
            ms = 100.0 * (1.6 if slow else 1.0) + rank * 0.5
            out.append(_step(sc, rank, step, sc.step_time(step, rank), ms, epoch=0))
        if step and step % sc.checkpoint_every == 0:
            t = sc.step_time(step, sc.ranks) + 20 * MS
            for action in (CheckpointAction.WRITTEN, CheckpointAction.VERIFIED):
                out.append(_ckpt(sc, action, step, t))
                t += 30 * MS
    out.append(_ev(Injection(drill_id="drill-1", scenario="worker-exit", fault="worker-exit",
                             phase="start", target=f"rank {sc.kill_rank}"),
                   sc.job, sc.kill_time - 5 * MS, ("inj", "start"), source="drill"))
    out.append(_ev(ProcessExit(pid=_pid(sc.kill_rank, 0), rank=sc.kill_rank, binding_epoch=0,
                               signal=9, detected_by="pidfd"),
                   sc.job, sc.kill_time, ("exit", sc.kill_rank),
                   Subject(node=sc.node, rank=sc.kill_rank)))
    for rank in range(sc.ranks) if sc.peer_exits else ():
        if rank != sc.kill_rank:
            out.append(_ev(ProcessExit(pid=_pid(rank, 0), rank=rank, binding_epoch=0,
                                       exit_code=3, detected_by="pidfd"),
                           sc.job, sc.kill_time, ("exit", rank), Subject(node=sc.node, rank=rank)))
    resume_at = sc.kill_time + sc.recovery_us
    ck = sc.last_checkpoint
    out.append(_ckpt(sc, CheckpointAction.LOADED, ck, resume_at - 400 * MS))
    for i in range(sc.resume_steps):
        step = ck + 1 + i
        for rank in range(sc.ranks):
            epoch = 1 if rank == sc.kill_rank or sc.restart_all else 0
            t = resume_at + i * STEP_US + rank * 10 * MS
            out.append(_step(sc, rank, step, t, 100.0 + rank * 0.5, epoch=epoch))
    out.append(_ev(Injection(drill_id="drill-1", scenario="worker-exit", fault="worker-exit",
                             phase="stop", target=f"rank {sc.kill_rank}"),
                   sc.job, resume_at + 2 * S, ("inj", "stop"), source="drill"))
    end = resume_at + sc.resume_steps * STEP_US
    for seq, t in enumerate(range(T0, end, S)):
        for node in (sc.node, sc.spare_node):
            out.append(_telemetry(sc, node, t + 500 * MS, seq,
                                  degraded=node == sc.node and sc.kill_time <= t < resume_at))
    return out


def _pid(rank: int, epoch: int) -> int:
    return 4100 + rank + 100 * epoch


def _node(sc: Scenario, rank: int, epoch: int) -> str:  # the killed rank moves to the spare
    return sc.spare_node if (rank == sc.kill_rank and epoch > 0) else sc.node


def _step(sc: Scenario, rank: int, step: int, t: int, ms: float, epoch: int) -> Event:
    rep = StepReport(rank=rank, world_size=sc.ranks, binding_epoch=epoch, step=step,
                     samples_consumed=(step + 1) * BATCH, compute_ms=ms, comm_ms=5.0,
                     step_ms=ms + 5.0, loss=round(2.0 - step * 0.005, 4),
                     pid=_pid(rank, epoch))
    return _ev(rep, sc.job, t, ("step", rank, step, epoch, t),
               Subject(node=_node(sc, rank, epoch), rank=rank))


def _ckpt(sc: Scenario, action: CheckpointAction, step: int, t: int) -> Event:
    c = CheckpointEvent(action=action, step=step, samples_consumed=(step + 1) * BATCH,
                        path=f"/ckpt/{sc.job}/step-{step:06d}", size_bytes=48_000_000,
                        write_ms=210.0 if action is CheckpointAction.WRITTEN else None)
    return _ev(c, sc.job, t, ("ckpt", action.value, step))


def _telemetry(sc: Scenario, node: str, t: int, seq: int, degraded: bool) -> Event:
    gpus = [GpuSample(index=g, temperature_c=61.0 + g, power_w=300.0, sm_util_pct=0.0 if
                      degraded and g == sc.kill_rank else 93.0, sm_clock_mhz=1980.0)
            for g in range(4)]
    nics = [NicSample(name="eth0", operstate="up", carrier=True, rx_errors=seq // 10,
                      tx_errors=0, rx_bytes_per_s=9.0e8, tx_bytes_per_s=9.1e8)]
    peer = sc.spare_node if node == sc.node else sc.node
    paths = [PeerPath(peer=peer, rtt_ms=2.4 if degraded else 0.21, retransmits=seq // 20)]
    return _ev(NodeTelemetry(interval_ms=1000.0, seq=seq, gpus=gpus, nics=nics, paths=paths),
               sc.job, t, ("tel", node, seq), Subject(node=node), source="agent")


def live_verdicts(events: Iterable[Event], rules: RuleSet, job: str) -> list[Event]:
    """The verdicts a live streams worker records: every released event evaluated, no flush."""
    engine = RuleEngine(job, rules)
    out: list[Event] = []
    for ev in sorted(events, key=order_key):
        if ev.type in ("step.report", "heartbeat", "process.exit", "checkpoint",
                       "telemetry.node", "node.health"):
            out += engine.feed(ev)
    return out


def decisions(sc: Scenario, verdicts: list[Event]) -> list[Event]:
    """The actuator's part: tier 1 for the straggler, migrate + resume for the exit."""
    out: list[Event] = []
    for v in verdicts:
        p = v.payload
        assert isinstance(p, Verdict)
        if p.state is not VerdictState.OPEN:
            continue
        if p.kind is VerdictKind.STRAGGLER and p.severity.value != "info":
            out += _command(sc, v, 1, [(OutcomeStatus.DONE, 300)],
                            RaiseQuotaParams(rank=v.subject.rank, quota_pct=200))
        if p.kind is VerdictKind.PROCESS_EXIT and v.subject.rank == sc.kill_rank:
            out += _migrate_and_resume(sc, v)
    return out


def _command(sc: Scenario, cause: Event, tier: int, outcomes: list[tuple[OutcomeStatus, int]],
             params: ActionParams, after_ms: int = 200) -> list[Event]:
    p = cause.payload
    assert isinstance(p, Verdict)
    action = params.action
    cid = derived_id("cmd", p.verdict_id, action.value)
    t = cause.event_time + after_ms * MS
    cmd = Command(command_id=cid, idempotency_key=cid, action=action, tier=tier, issued_at=t,
                  issued_by="synth.policy", cause_verdict_ids=[p.verdict_id],
                  params=params)
    out = [_ev(cmd, sc.job, t, ("cmd", cid), cause.subject, source="decide")]
    out.append(_ev(CommandOutcome(command_id=cid, idempotency_key=cid, action=action,
                                  status=OutcomeStatus.ACCEPTED, started_at=t + 20 * MS),
                   sc.job, t + 20 * MS, ("out", cid, "accepted"), cause.subject, "actuator"))
    for status, ms in outcomes:
        out.append(_ev(CommandOutcome(command_id=cid, idempotency_key=cid, action=action,
                                      status=status, started_at=t + 20 * MS,
                                      finished_at=t + ms * MS),
                       sc.job, t + ms * MS, ("out", cid, status.value), cause.subject,
                       "actuator"))
    return out


def _migrate_and_resume(sc: Scenario, cause: Event) -> list[Event]:
    r = sc.kill_rank
    resume_at = sc.kill_time + sc.recovery_us
    since = (resume_at - cause.event_time) // MS
    out = _command(sc, cause, 2, [(OutcomeStatus.DONE, 1600)],
                   MigrateParams(rank=r, ranks=[r], reason=VerdictKind.PROCESS_EXIT), after_ms=150)
    mig = out[0].payload
    assert isinstance(mig, Command)
    t = mig.issued_at
    old, new = f"{sc.node}/cpu12-15", f"{sc.spare_node}/cpu0-3"
    moved = range(sc.ranks) if sc.restart_all else [r]
    for i, rank in enumerate(moved):
        unit = f"{sc.node}/cpu{rank * 4}-{rank * 4 + 3}" if rank != r else old
        out.append(_ev(PoolUnit(unit=unit, state=UnitState.FENCED, node=sc.node, rank=rank,
                                epoch=0, pid=_pid(rank, 0), command_id=mig.command_id,
                                reason="rank exited" if rank == r else "job restart",
                                released=["cgroup", f"port {29500 + rank}",
                                          f"/tmp/tg-rank{rank}"]),
                       sc.job, t + (700 + 10 * i) * MS, ("pool", unit, "fenced"),
                       Subject(unit=unit, rank=rank), "actuator"))
    for i, rank in enumerate(moved):
        unit = f"{sc.node}/cpu{rank * 4}-{rank * 4 + 3}" if rank != r else new
        node = sc.spare_node if rank == r else sc.node
        out.append(_ev(PoolUnit(unit=unit, state=UnitState.BOUND, node=node, rank=rank,
                                epoch=1, pid=_pid(rank, 1), command_id=mig.command_id),
                       sc.job, t + (1400 + 10 * i) * MS, ("pool", unit, "bound"),
                       Subject(unit=unit, rank=rank), "actuator"))
    out += _command(sc, cause, 3, [(OutcomeStatus.DONE, since - 1700 - 300)],
                    ResumeParams(reason=f"from checkpoint step {sc.last_checkpoint}"),
                    after_ms=1700)
    return out


def incident_log(sc: Scenario | None = None, rules: RuleSet | None = None) -> list[Event]:
    """The whole log (no incident transitions), in (event_time, event_id) order."""
    sc = sc or Scenario()
    obs = observations(sc)
    verdicts = live_verdicts(obs, rules or load_default_rules(), sc.job)
    log = obs + verdicts + decisions(sc, verdicts)
    return sorted(log, key=order_key)
