"""The decision, incident, actuator, alerts and metrics services, whole, on the in-memory
bus: what they read, what they publish, and that a restart does nothing twice — without a
broker."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests import keys
from trainguard.actuators import signing
from trainguard.actuators.backend import (
    KnowsHealth,
    Released,
    Replica,
    SetsQuota,
    StaleAction,
    WatchesAllocation,
)
from trainguard.actuators.decider import Decider, DeciderOptions
from trainguard.actuators.jobspec import JobSpec, JobSpecError, UnitSpec, parse_job_spec
from trainguard.actuators.policy import PolicyConfig
from trainguard.actuators.service import Actuator, ActuatorOptions
from trainguard.actuators.signing import verify
from trainguard.alerts.channels.base import HttpRequest
from trainguard.alerts.config import build, parse
from trainguard.alerts.http import PostFailed, Reply
from trainguard.alerts.service import AlertsService
from trainguard.alerts.service import ServiceOptions as AlertsOptions
from trainguard.bus.dlq import DeadLetter
from trainguard.bus.memory import MemoryBus, Record
from trainguard.events.clock import now_us
from trainguard.events.codec import decode, make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    Command,
    CommandAction,
    CommandOutcome,
    IncidentState,
    IncidentTransition,
    JobEnded,
    MigrateParams,
    OutcomeStatus,
    PoolUnit,
    RaiseQuotaParams,
    RestartData,
    SchedulerEnd,
    Severity,
    StopProof,
    UnitState,
    Verdict,
    VerdictKind,
    VerdictState,
)
from trainguard.events.topics import TopicRole
from trainguard.incidents import IncidentSettings, rebuild
from trainguard.incidents.query import canonical
from trainguard.incidents.service import ServiceStats, serve
from trainguard.incidents.synth import incident_log
from trainguard.metrics.recorder import Recorder
from trainguard.metrics.registry import PipelineMetrics
from trainguard.metrics.service import MetricsService

pytestmark = pytest.mark.unit
JOB = "job-a"
KEY = keys.COMMAND
T = 1_800_000_000_000_000


async def run_until(service: Callable[[asyncio.Event], Coroutine[Any, Any, Any]],
                    done: Callable[[], bool], limit_s: float = 20.0) -> Any:
    """Run a service until ``done()`` (or the limit), then stop it; what it returned."""
    stop = asyncio.Event()
    task = asyncio.create_task(service(stop))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    try:
        while not done() and not task.done() and loop.time() < deadline:
            await asyncio.sleep(0.02)
    finally:
        stop.set()
    return await task


# --- decide --------------------------------------------------------------------------------


def _unit(name: str, state: UnitState, rank: int | None, pid: int | None) -> Event:
    return make_event(PoolUnit(unit=name, state=state, node="n1", rank=rank, pid=pid,
                               epoch=1 if rank is not None else None),
                      event_id=derived_id("u", name, state.value), job_id=JOB, event_time=T,
                      source="test", subject=Subject(unit=name))


def _exit_verdict() -> Event:
    v = Verdict(verdict_id="v-exit-1", rule="process_exit", kind=VerdictKind.PROCESS_EXIT,
                state=VerdictState.OPEN, severity=Severity.CRITICAL, first_anomalous_time=T,
                decided_time=T, evidence={"pid": 101, "signal": 9})
    return make_event(v, event_id="ev-verdict-1", job_id=JOB, event_time=T, source="test",
                      subject=Subject(rank=1, node="n1"))


def _commands(bus: MemoryBus) -> list[Event]:
    return [e for e in bus.events(TopicRole.COMMANDS) if isinstance(e.payload, Command)]


def _scancelled_exits() -> list[Event]:
    """Every rank killed at once by the scheduler: exits whose status nobody read, declared
    by nobody (as under Slurm's ``scancel``)."""
    return [make_event(Verdict(verdict_id=f"v-x{r}", rule="process_exit",
                               kind=VerdictKind.PROCESS_EXIT, state=VerdictState.OPEN,
                               severity=Severity.CRITICAL, first_anomalous_time=T + r,
                               decided_time=T + r, evidence={"pid": 100 + r}),
                       event_id=f"ev-exit-{r}", job_id=JOB, event_time=T + r, source="test",
                       subject=Subject(rank=r, node="n1")) for r in (0, 1)]


def _job_ended() -> Event:
    return make_event(JobEnded(end=SchedulerEnd.CANCELLED, allocation="slurm:7",
                               state="CANCELLED"),
                      event_id="ev-ended", job_id=JOB, event_time=T + 500_000, source="test")


@pytest.mark.parametrize("signed", [True, False])
def test_decide_believes_only_a_signed_job_end_and_then_calls_nobody(signed: bool) -> None:
    """The exits of a job the scheduler ended move nothing once the actuator's signed word is
    read; an unsigned ``job.ended`` (anyone can write to the outcomes topic) is not believed:
    the exits are decided as failures once the wait for that word is over."""
    bus = MemoryBus()
    opts = DeciderOptions(key=KEY, actuators=keys.ACTUATOR_PUBS,
                          policy=PolicyConfig(settle_s=0, scheduler_settle_s=0.3), tick_s=0.02)
    pool = [_unit("u0", UnitState.BOUND, 0, 100), _unit("u1", UnitState.BOUND, 1, 101),
            _unit("spare", UnitState.SPARE, None, None)]

    async def go() -> Decider:
        log = [*pool, *_scancelled_exits()] + ([_job_ended()] if signed else [])
        await bus.publish(signing.sign_log(log, keys.COMMAND, keys.ACTUATOR))
        if not signed:
            await bus.publish([_job_ended()])
        decider = Decider(bus, opts)
        await run_until(decider.run, lambda: bool(_commands(bus)), limit_s=2.0)
        return decider

    decider = asyncio.run(asyncio.wait_for(go(), 60))
    if signed:
        assert _commands(bus) == [] and decider.state.ended == {JOB: SchedulerEnd.CANCELLED}
    else:
        assert [c.payload.action for c in _commands(bus)
                if isinstance(c.payload, Command)] == [CommandAction.MIGRATE]
        assert decider.state.ended == {}


def test_decide_reads_the_bus_and_publishes_one_signed_migrate_and_never_twice() -> None:
    bus = MemoryBus()
    opts = DeciderOptions(key=KEY, actuators=keys.ACTUATOR_PUBS,
                          policy=PolicyConfig(settle_s=0), tick_s=0.02)

    async def go() -> None:
        await bus.publish(signing.sign_log(  # the pool as the actuator signed it
            [_unit("u0", UnitState.BOUND, 0, 100), _unit("u1", UnitState.BOUND, 1, 101),
             _unit("spare", UnitState.SPARE, None, None), _exit_verdict()],
            keys.COMMAND, keys.ACTUATOR))
        await run_until(Decider(bus, opts).run, lambda: bool(_commands(bus)))
        await asyncio.sleep(0)
        # a restarted service rebuilds from the log and finds the command already issued
        restarted = Decider(bus, opts)
        await run_until(restarted.run, lambda: False, limit_s=1.0)  # many ticks
        assert restarted.state.issued  # it did rebuild its state from the log

    asyncio.run(asyncio.wait_for(go(), 60))
    (ev,) = _commands(bus)
    cmd = ev.payload
    assert isinstance(cmd, Command) and cmd.action is CommandAction.MIGRATE
    assert isinstance(cmd.params, MigrateParams)
    assert cmd.params.ranks == [1] and cmd.params.from_units == ["u1"]
    assert cmd.cause_verdict_ids == ["v-exit-1"]
    assert verify(keys.COMMAND_PUB, ev) is None  # signed by decide's key
    assert ev.ingest_time is not None  # stamped by the producer


# --- incidents -----------------------------------------------------------------------------

LOG = incident_log()
SETTINGS = IncidentSettings()


def _transitions(bus: MemoryBus) -> list[Event]:
    return [e for e in bus.events(TopicRole.INCIDENTS) if e.type == "incident.transition"]


def test_incident_service_publishes_the_rebuilt_transitions_once() -> None:
    expected = rebuild(LOG, SETTINGS)
    assert expected
    bus = MemoryBus()

    async def go() -> tuple[ServiceStats, ServiceStats]:
        await bus.publish(LOG[: len(LOG) // 2])  # half before it starts, half while it runs
        first = ServiceStats()

        async def service(stop: asyncio.Event) -> ServiceStats:
            return await serve(bus, settings=SETTINGS, idle_flush_s=0.2, stop=stop,
                               stats=first)

        stop = asyncio.Event()
        task = asyncio.create_task(service(stop))
        await asyncio.sleep(0.1)
        await bus.publish(LOG[len(LOG) // 2:])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while len(_transitions(bus)) < len(expected) and loop.time() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        await task
        again = ServiceStats()
        await run_until(lambda s: serve(bus, settings=SETTINGS, idle_flush_s=0.2, stop=s,
                                        stats=again),
                        lambda: again.already_published >= len(expected), limit_s=10)
        return first, again

    first, again = asyncio.run(asyncio.wait_for(go(), 90))
    got = _transitions(bus)
    assert sorted(canonical(t) for t in got) == sorted(canonical(t) for t in expected)
    assert first.published == len(expected) and first.batches >= 1  # the live half too
    assert again.published == 0 and again.already_published == len(expected)
    assert len(_transitions(bus)) == len(expected)


# --- the actuator --------------------------------------------------------------------------


class FakeBackend:
    """The Backend Protocol in memory: replicas are records, nothing runs; what was asked."""

    def __init__(self) -> None:
        self.replicas: dict[int, Replica] = {}
        self.quotas: list[tuple[str, float | None]] = []
        self.argvs: dict[tuple[int, int], list[str]] = {}  # (rank, epoch) -> its command
        self._pid = 4000

    def launch(self, job: JobSpec, unit: UnitSpec, rank: int, epoch: int, port: int,
               command_id: str | None = None, master_addr: str | None = None) -> Replica:
        self.argvs[(rank, epoch)] = job.argv(rank, epoch, port, unit.name, master_addr)
        self._pid += 1
        rep = Replica(rank=rank, unit=unit.name, epoch=epoch, pid=self._pid, create_time=1.0)
        self.replicas[rank] = rep
        return rep

    def fence(self, job: JobSpec, replica: Replica) -> Released:
        self.replicas.pop(replica.rank, None)
        return Released((replica.unit,), StopProof.SIGTERM)

    def live(self, job: JobSpec) -> list[Replica]:
        return list(self.replicas.values())

    def epoch(self, job: JobSpec, rank: int | None = None) -> int:
        return max((r.epoch for r in self.replicas.values()
                    if rank is None or r.rank == rank), default=0)

    def stop_stale(self, job: JobSpec, rank: int, epoch: int, pid: int | None) -> StaleAction:
        return "discarded"

    def set_quota(self, job: JobSpec, unit: UnitSpec, pct: float | None) -> str:
        self.quotas.append((unit.name, pct))
        return f"quota {pct}"

    def request_checkpoint(self, job: JobSpec, replica: Replica) -> str:
        return "asked"

    def unreachable(self, job: JobSpec, unit: UnitSpec) -> str | None:
        return None


def _job(tmp_path: Path) -> JobSpec:
    return JobSpec(job_id=JOB, world_size=1, command=("true",), node="n1",
                   units=(UnitSpec("u0", (0,), 0), UnitSpec("spare", (1,), None)),
                   ckpt_dir=tmp_path / "ckpt", log_dir=tmp_path / "logs")


def _quota_command(key: str, *, signed: bool) -> Event:
    cmd = Command(command_id=f"cmd-{key}", idempotency_key=key,
                  action=CommandAction.RAISE_QUOTA, tier=1, issued_at=now_us(),
                  issued_by="trainguard-decide", params=RaiseQuotaParams(rank=0, quota_pct=80))
    subject = Subject(rank=0)
    if signed:
        cmd = signing.sign(KEY, JOB, subject, cmd)
    return make_event(cmd, event_id=f"ev-{key}", job_id=JOB, event_time=cmd.issued_at,
                      source="test", subject=subject)


def _outcomes(bus: MemoryBus) -> list[CommandOutcome]:
    return [e.payload for e in bus.events(TopicRole.OUTCOMES)
            if isinstance(e.payload, CommandOutcome)]


def test_actuator_acts_once_on_a_signed_command_and_dead_letters_an_unsigned_one(
        tmp_path: Path) -> None:
    bus = MemoryBus()
    backend = FakeBackend()
    opts = ActuatorOptions(job=_job(tmp_path), key=keys.COMMAND_PUB, signer=keys.ACTUATOR,
                           state_dir=tmp_path / "state", launch=True)
    good = _quota_command("k-good", signed=True)

    async def go() -> None:
        first = Actuator(bus, opts, backend)
        await bus.publish([_quota_command("k-unsigned", signed=False), good])
        await run_until(first.run, lambda: len(_outcomes(bus)) >= 2)
        # restarted: the group's position is committed, the ledger is rebuilt from the log;
        # the very same signed command sent again is a replay, refused, never acted on
        await run_until(Actuator(bus, opts, backend).run, lambda: False, limit_s=0.5)
        await bus.publish([good])
        await run_until(Actuator(bus, opts, backend).run, lambda: len(_outcomes(bus)) >= 3)

    asyncio.run(asyncio.wait_for(go(), 60))
    got = [(o.idempotency_key, o.status) for o in _outcomes(bus)]
    assert got == [("k-good", OutcomeStatus.ACCEPTED), ("k-good", OutcomeStatus.DONE),
                   ("k-good", OutcomeStatus.REFUSED)]
    assert backend.quotas == [("u0", 80)]  # acted once
    outs = [e for e in bus.events(TopicRole.OUTCOMES) if isinstance(e.payload, CommandOutcome)]
    assert all(signing.verify_event(keys.ACTUATOR_PUBS, e) is None for e in outs)  # its key
    letters = [DeadLetter.decode(r.value) for r in bus.records(TopicRole.DLQ)
               if r.value is not None]
    assert len(letters) == 1 and "signature" in letters[0].reason
    assert decode(base64.b64decode(letters[0].value_b64)).event_id == "ev-k-unsigned"
    assert len(backend.replicas) == 1  # launched once: the restarts found the job bound


class NoQuotaBackend(FakeBackend):
    """A backend with no CPU quota (as Slurm's): the same calls but ``set_quota``."""

    set_quota = None  # type: ignore[assignment]


def test_a_backend_without_quota_says_so_in_its_units_and_fails_raise_quota(
        tmp_path: Path) -> None:
    bus = MemoryBus()
    backend = NoQuotaBackend()
    assert not isinstance(backend, SetsQuota) and isinstance(FakeBackend(), SetsQuota)
    opts = ActuatorOptions(job=_job(tmp_path), key=keys.COMMAND_PUB, signer=keys.ACTUATOR,
                           state_dir=tmp_path / "state", launch=True)

    async def go() -> None:
        await bus.publish([_quota_command("k-noquota", signed=True)])
        await run_until(Actuator(bus, opts, backend).run, lambda: len(_outcomes(bus)) >= 2)

    asyncio.run(asyncio.wait_for(go(), 60))
    units = [e.payload for e in bus.events(TopicRole.OUTCOMES)
             if isinstance(e.payload, PoolUnit)]
    assert units and all(not u.quota for u in units)
    done = _outcomes(bus)[-1]
    assert done.status is OutcomeStatus.FAILED and "sets no CPU quota" in done.detail


def test_a_migration_of_rank_0_moves_where_every_rank_meets(tmp_path: Path) -> None:
    """``{master_addr}`` follows rank 0: moved to the spare, every rank of the new epoch meets
    at the spare's address (CI's 2026-12-07 slurm-rank-kill runs moved rank 0 to tgn4 and
    relaunched every rank towards tgn1's fixed address: no rank ever joined)."""
    bus = MemoryBus()
    backend = FakeBackend()
    job = JobSpec(job_id=JOB, world_size=2, node="n1",
                  command=("w", "--master-addr", "{master_addr}", "--rank", "{rank}"),
                  units=(UnitSpec("u0", (0,), 0, address="10.0.0.1"),
                         UnitSpec("u1", (1,), 1, address="10.0.0.2"),
                         UnitSpec("spare", (1,), None, address="10.0.0.3")),
                  ckpt_dir=tmp_path / "ckpt", log_dir=tmp_path / "logs")
    opts = ActuatorOptions(job=job, key=keys.COMMAND_PUB, signer=keys.ACTUATOR,
                           state_dir=tmp_path / "state", launch=True)
    cmd = Command(command_id="cmd-m0", idempotency_key="k-m0", action=CommandAction.MIGRATE,
                  tier=2, issued_at=now_us(), issued_by="trainguard-decide",
                  params=MigrateParams(rank=0, resume=True, reason=VerdictKind.PROCESS_EXIT,
                                       ranks=[0], from_unit="u0", from_units=["u0"]))
    cmd = signing.sign(KEY, JOB, Subject(rank=0), cmd)

    async def go() -> None:
        await bus.publish([make_event(cmd, event_id="ev-migrate-0", job_id=JOB,
                                      event_time=cmd.issued_at, source="test",
                                      subject=Subject(rank=0))])
        await run_until(Actuator(bus, opts, backend).run, lambda: len(_outcomes(bus)) >= 2)

    asyncio.run(asyncio.wait_for(go(), 60))
    assert _outcomes(bus)[-1].status is OutcomeStatus.DONE, _outcomes(bus)[-1].detail
    meets = {key: argv[2] for key, argv in backend.argvs.items()}
    assert meets == {(0, 1): "10.0.0.1", (1, 1): "10.0.0.1",
                     (0, 2): "10.0.0.3", (1, 2): "10.0.0.3"}


def test_an_elastic_job_migrates_only_the_moved_rank(tmp_path: Path) -> None:
    """``elastic``: each unit runs a launcher that re-forms the group (torchrun). A migrate
    fences and relaunches rank 1 alone, on the spare at a new epoch; ranks 0 and 2 keep their
    replicas (pids), bound at the new epoch too, which the job's epoch file says for the
    workers their launchers restart."""
    bus = MemoryBus()
    backend = FakeBackend()
    job = JobSpec(job_id=JOB, world_size=3, node="n1", elastic=True,
                  command=("torchrun", "--rdzv-endpoint", "head:29400", "w", "{rank}"),
                  units=(UnitSpec("u0", (0,), 0), UnitSpec("u1", (1,), 1),
                         UnitSpec("u2", (0,), 2), UnitSpec("spare", (1,), None)),
                  ckpt_dir=tmp_path / "ckpt", log_dir=tmp_path / "logs")
    opts = ActuatorOptions(job=job, key=keys.COMMAND_PUB, signer=keys.ACTUATOR,
                           state_dir=tmp_path / "state", launch=True)
    cmd = Command(command_id="cmd-e1", idempotency_key="k-e1", action=CommandAction.MIGRATE,
                  tier=2, issued_at=now_us(), issued_by="trainguard-decide",
                  params=MigrateParams(rank=1, reason=VerdictKind.NODE_SILENT, ranks=[1],
                                       from_unit="u1", from_units=["u1"]))
    cmd = signing.sign(KEY, JOB, Subject(rank=1), cmd)
    before: dict[int, Replica] = {}

    async def go() -> None:
        await run_until(Actuator(bus, opts, backend).run, lambda: len(backend.replicas) == 3)
        before.update(backend.replicas)
        await bus.publish([make_event(cmd, event_id="ev-elastic-1", job_id=JOB,
                                      event_time=cmd.issued_at, source="test",
                                      subject=Subject(rank=1))])
        await run_until(Actuator(bus, opts, backend).run, lambda: len(_outcomes(bus)) >= 2)

    asyncio.run(asyncio.wait_for(go(), 60))
    done = _outcomes(bus)[-1]
    assert done.status is OutcomeStatus.DONE, done.detail
    assert "ranks [0, 2] keep their replicas" in done.detail
    assert isinstance(done.data, RestartData) and done.data.epoch == 2
    after = backend.replicas
    assert {r: (p.unit, p.epoch) for r, p in after.items()} == {
        0: ("u0", 1), 1: ("spare", 2), 2: ("u2", 1)}
    assert after[0] == before[0] and after[2] == before[2]  # never fenced nor relaunched
    assert sorted(backend.argvs) == [(0, 1), (1, 1), (1, 2), (2, 1)]
    units = [e.payload for e in bus.events(TopicRole.OUTCOMES) if isinstance(e.payload, PoolUnit)]
    fenced = [(u.unit, u.rank, u.epoch) for u in units if u.state is UnitState.FENCED]
    assert fenced == [("u1", 1, 1)]
    rebound = [(u.unit, u.rank, u.epoch, u.pid, u.resources.get("launch_epoch"))
               for u in units if u.state is UnitState.BOUND and u.command_id == "cmd-e1"]
    assert rebound == [("spare", 1, 2, after[1].pid, None),
                       ("u0", 0, 2, before[0].pid, 1), ("u2", 2, 2, before[2].pid, 1)]
    assert job.epoch_file is not None and job.epoch_file.read_text() == "2\n"
    assert job.env_for("u0")["TRAINGUARD_BINDING_EPOCH_FILE"] == str(job.epoch_file)


def test_an_elastic_command_names_no_per_launch_endpoint(tmp_path: Path) -> None:
    """The survivors of an elastic job keep their endpoint: ``{port}`` (fresh per launch) and
    ``{master_addr}`` (moves with rank 0) are refused in its command, in one line."""
    doc = {"job_id": "j1", "world_size": 1, "ckpt_dir": str(tmp_path), "elastic": True,
           "command": ["torchrun", "--master-port", "{port}", "w"],
           "units": [{"name": "u0", "rank": 0}]}
    with pytest.raises(JobSpecError, match=r"field 'command': \{port\} with 'elastic'"):
        parse_job_spec(doc, "job.yaml")
    with pytest.raises(JobSpecError, match="field 'elastic': true or false"):
        parse_job_spec({**doc, "elastic": "yes"}, "job.yaml")
    assert parse_job_spec({**doc, "command": ["torchrun", "w"]}).elastic


class SchedulerBackend(FakeBackend):
    """A backend whose scheduler finds the spare unusable (as Slurm's sinfo can)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: list[list[str]] = []

    def unusable(self, units: Sequence[str]) -> dict[str, str]:
        self.asked.append(list(units))
        return {"spare": "slurm: down+NOT_RESPONDING"}


def test_a_spare_the_scheduler_finds_unusable_is_registered_failed(tmp_path: Path) -> None:
    bus = MemoryBus()
    backend = SchedulerBackend()
    assert isinstance(backend, KnowsHealth) and not isinstance(FakeBackend(), KnowsHealth)
    opts = ActuatorOptions(job=_job(tmp_path), key=keys.COMMAND_PUB, signer=keys.ACTUATOR,
                           state_dir=tmp_path / "state", launch=True)

    def units() -> dict[str, PoolUnit]:
        return {e.payload.unit: e.payload for e in bus.events(TopicRole.OUTCOMES)
                if isinstance(e.payload, PoolUnit)}

    async def go() -> None:
        await run_until(Actuator(bus, opts, backend).run,
                        lambda: units().get("u0", None) is not None
                        and units()["u0"].state is UnitState.BOUND)

    asyncio.run(asyncio.wait_for(go(), 60))
    got = units()
    assert backend.asked == [["spare"]]  # only the spares are asked about
    assert got["spare"].state is UnitState.FAILED
    assert got["spare"].reason == "registered from the job spec: slurm: down+NOT_RESPONDING"
    assert got["u0"].state is UnitState.BOUND  # the rank's own unit is launched as before


# --- alerts --------------------------------------------------------------------------------


class RecordingPoster:
    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def post(self, request: HttpRequest, timeout_s: float) -> Reply | PostFailed:
        self.bodies.append(request.body)
        return Reply(200, b"ok")

    async def close(self) -> None:
        pass


def _transition(inc: str, seq: int, frm: IncidentState | None,
                to: IncidentState) -> Event:
    payload = IncidentTransition(incident_id=inc, seq=seq, from_state=frm, to_state=to,
                                 reason=f"test {to.value}")
    return make_event(payload, event_id=derived_id("test-it", inc, seq), job_id=JOB,
                      event_time=now_us(), source="test", subject=Subject(node="n1", rank=0))


def test_alerts_send_one_notice_per_incident_to_a_channel() -> None:
    bus = MemoryBus()
    config = build(parse({"channels": [{"name": "hook", "type": "webhook",
                                        "url": "https://hooks.example.com/tg"}],
                          "coalesce": {"hold_s": 0, "flush_s": 0.05}}), environ={})
    poster = RecordingPoster()
    service = AlertsService(config, bus, AlertsOptions(group_id="tg-alerts",
                                                        from_offset="earliest", poll_ms=20,
                                                        commit_every_s=0.05),
                            poster=poster)
    incs = ["inc-a", "inc-b", "inc-c"]
    opened = [_transition(i, n, frm, to) for i in incs for n, (frm, to) in enumerate(
        [(None, IncidentState.DETECTED), (IncidentState.DETECTED, IncidentState.LOCATED)])]

    async def go() -> None:
        await bus.publish(opened)
        await run_until(service.run, lambda: len(poster.bodies) >= len(incs))
        # restarted with the same group: what was delivered and committed is not sent again
        again = AlertsService(config, bus, AlertsOptions(group_id="tg-alerts", poll_ms=20),
                              poster=poster)
        await run_until(again.run, lambda: False, limit_s=0.5)

    asyncio.run(asyncio.wait_for(go(), 60))
    per_incident = Counter(i for body in poster.bodies for i in incs if i.encode() in body)
    assert per_incident == Counter(incs), poster.bodies
    assert len(poster.bodies) == len(incs)


# --- metrics -------------------------------------------------------------------------------


def test_metrics_count_each_event_once_and_invalid_records_apart() -> None:
    bus = MemoryBus()
    events = LOG[:40]
    task = bus.names.name(TopicRole.TASK)

    def total(recorder: Recorder, name: str) -> float:
        return sum(s.value for m in recorder.metrics.registry.collect() for s in m.samples
                   if s.name == name)

    async def go() -> tuple[Recorder, Recorder]:
        prod = bus.producer()
        await prod.start()
        for e in events:
            await prod.send(e)
        for e in events[:10]:  # redelivered (the same event id twice on the log)
            await prod.send(e)
        await prod.send_raw(task, b"not an event", key=b"job")
        bus.append(task, Record(b"job", None))  # a tombstone
        await prod.stop()
        first = Recorder(PipelineMetrics())
        service = MetricsService(bus, first, group_id="tg-metrics", from_offset="earliest",
                                 lag_every_s=0.0)
        await run_until(lambda s: _metrics_until(service, s),
                        lambda: total(first, "trainguard_invalid_records_total") >= 2
                        and total(first, "trainguard_events_total") >= len(events))
        # restarted, same group: what was committed is not counted again
        again = Recorder(PipelineMetrics())
        restarted = MetricsService(bus, again, group_id="tg-metrics", lag_every_s=0.0)
        await run_until(lambda s: _metrics_until(restarted, s), lambda: False, limit_s=0.5)
        return first, again

    first, again = asyncio.run(asyncio.wait_for(go(), 60))
    assert total(first, "trainguard_events_total") == len(events)
    assert total(first, "trainguard_invalid_records_total") == 2
    assert total(first, "trainguard_consumer_lag_records") == 0  # read to the end
    assert total(again, "trainguard_events_total") == 0
    assert total(again, "trainguard_invalid_records_total") == 0


async def _metrics_until(service: MetricsService, stop: asyncio.Event) -> None:
    async def relay() -> None:
        await stop.wait()
        service.stopping.set()
    waiter = asyncio.create_task(relay())
    try:
        await service.run()
    finally:
        waiter.cancel()


class AllocationBackend(FakeBackend):
    """A backend whose job lives in a scheduler's allocation, which a test ends (as Slurm's
    ``scancel`` of it, or its time limit)."""

    def __init__(self) -> None:
        super().__init__()
        self.end: JobEnded | None = None
        self.asked = 0

    def job_end(self) -> JobEnded | None:
        self.asked += 1
        return self.end


def _restart_command(key: str) -> Event:
    cmd = Command(command_id=f"cmd-{key}", idempotency_key=key, action=CommandAction.MIGRATE,
                  tier=2, issued_at=now_us(), issued_by="trainguard-decide",
                  params=MigrateParams(rank=0, resume=True, reason=VerdictKind.PROCESS_EXIT,
                                       ranks=[0], from_unit="u0", from_units=["u0"]))
    cmd = signing.sign(KEY, JOB, Subject(rank=0), cmd)
    return make_event(cmd, event_id=f"ev-{key}", job_id=JOB, event_time=cmd.issued_at,
                      source="test", subject=Subject(rank=0))


def test_the_schedulers_end_of_the_job_is_said_once_signed_and_nothing_is_restarted(
        tmp_path: Path) -> None:
    bus = MemoryBus()
    backend = AllocationBackend()
    assert isinstance(backend, WatchesAllocation) and not isinstance(FakeBackend(),
                                                                     WatchesAllocation)
    opts = ActuatorOptions(job=_job(tmp_path), key=keys.COMMAND_PUB, signer=keys.ACTUATOR,
                           state_dir=tmp_path / "state", launch=True, watch_s=0.05)

    def ended() -> list[Event]:
        return [e for e in bus.events(TopicRole.OUTCOMES) if isinstance(e.payload, JobEnded)]

    async def go() -> None:
        await run_until(Actuator(bus, opts, backend).run, lambda: backend.asked >= 3)
        assert ended() == []  # still running: nothing said
        backend.end = JobEnded(end=SchedulerEnd.CANCELLED, allocation="slurm:7",
                               state="CANCELLED")
        await run_until(Actuator(bus, opts, backend).run, lambda: bool(ended()))
        # a migrate decided before decide read the end: failed, nothing fenced or launched
        await bus.publish([_restart_command("k-after-end")])
        asked = backend.asked
        await run_until(Actuator(bus, opts, backend).run, lambda: len(_outcomes(bus)) >= 2)
        assert backend.asked == asked  # restarted: the end was read back from the log

    asyncio.run(asyncio.wait_for(go(), 60))
    (said,) = ended()  # once, though asked again by a restarted actuator
    assert signing.verify_event(keys.ACTUATOR_PUBS, said) is None
    assert said.event_id == derived_id("job.ended", JOB, "slurm:7")
    final = _outcomes(bus)[-1]
    assert final.status is OutcomeStatus.FAILED
    assert "the scheduler ended the job's allocation slurm:7 (CANCELLED)" in final.detail
    assert set(backend.argvs) == {(0, 1)}  # launched once, at the start, never again
