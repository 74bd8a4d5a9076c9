"""No poison pill, and duplicates folded once, for every consumer on the real broker.

Each test puts every kind of poison (a null value, a tombstone with a key, bytes that are not
UTF-8, cut-off JSON, a valid event with a bad field; ``poison.py``) between valid records on
the consumer's own topics, and asserts: every valid record was processed (the consumer's
outcome, as without the poison), every poison record is in the dead-letter topic once with its
reason (read-only tools skip them), the service is still running, and a restart neither crashes
nor dead-letters the same records again. The dedupe tests write every valid record twice (same
bytes, two offsets) and assert the same outcome as once.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import keys
from tests.integration.conftest import arun, read_events
from tests.integration.poison import Poison, assert_dead_lettered, dead_letters, publish, spread
from tests.integration.test_incident_service import run_service, transitions
from trainguard.actuators import signing
from trainguard.actuators.decider import Decider, DeciderOptions
from trainguard.actuators.policy import PolicyConfig
from trainguard.bus.config import KafkaConfig
from trainguard.bus.kafka import KafkaBus
from trainguard.bus.producer import EventProducer
from trainguard.events.clock import now_us
from trainguard.events.codec import decode, encode, make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    Command,
    CommandAction,
    PoolUnit,
    Severity,
    UnitState,
    Verdict,
    VerdictState,
)
from trainguard.events.topics import TopicRole
from trainguard.incidents import IncidentSettings, rebuild
from trainguard.incidents.query import canonical
from trainguard.incidents.source import write_log
from trainguard.incidents.synth import incident_log

pytestmark = pytest.mark.integration

LOG = incident_log()
SETTINGS = IncidentSettings()


def cli(kafka: KafkaConfig, *args: str,
        timeout_s: float = 60) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "trainguard.cli.main", *args, "--bootstrap",
                           kafka.bootstrap, "--prefix", kafka.topic_prefix],
                          capture_output=True, timeout=timeout_s, check=False)


# --- read-only tools: events tail, incident list, replay, replay export -------------------

def test_tail_list_replay_and_export_read_past_poison_as_if_it_were_not_there(
        kafka: KafkaConfig, tmp_path: Path) -> None:
    sent = arun(publish(kafka, LOG, poison_at=spread(LOG)))
    assert len(sent) == 15
    clean = tmp_path / "clean.jsonl"
    with clean.open("wb") as fh:
        write_log(LOG, fh)

    for attempt in range(2):  # a second run (a restart) reads the same poison again
        tail = cli(kafka, "events", "tail")
        assert tail.returncode == 0, tail.stderr.decode()[-2000:]
        ids = sorted(line.split(b'"event_id":"', 1)[1].split(b'"', 1)[0]
                     for line in tail.stdout.splitlines())
        assert ids == sorted(e.event_id.encode() for e in LOG)
        letters = arun(dead_letters(kafka, want=15 * (attempt + 1), consumer="tail"))
        assert_dead_lettered(letters, sent, times=attempt + 1)  # read-only: no commit

    for args in (("incident", "list"), ("replay",)):
        poisoned = cli(kafka, *args)
        offline = subprocess.run([sys.executable, "-m", "trainguard.cli.main", *args,
                                  "--log", str(clean)], capture_output=True, timeout=60,
                                 check=False)
        assert poisoned.returncode == offline.returncode == 0, poisoned.stderr.decode()[-2000:]
        assert poisoned.stdout == offline.stdout and b"incident" in poisoned.stdout
        assert b"Traceback" not in poisoned.stderr
    export = cli(kafka, "replay", "export")
    assert export.returncode == 0, export.stderr.decode()[-2000:]
    def bare(lines: list[bytes]) -> list[bytes]:  # the export carries the broker's stamp
        return [encode(decode(x).model_copy(update={"ingest_time": None})) for x in lines]

    assert bare(export.stdout.splitlines()) == bare(clean.read_bytes().splitlines())


# --- incident serve -------------------------------------------------------------------------

def test_incident_service_dead_letters_poison_once_and_publishes_every_transition(
        kafka: KafkaConfig) -> None:
    expected = rebuild(LOG, SETTINGS)
    sent = arun(publish(kafka, LOG, poison_at=spread(LOG)))
    first = arun(run_service(kafka, until=len(expected)))
    assert first.published == len(expected)
    got = arun(transitions(kafka))
    assert sorted(canonical(t) for t in got) == sorted(canonical(t) for t in expected)
    letters = arun(dead_letters(kafka, want=len(sent), consumer="incidents"))
    assert_dead_lettered(letters, sent)

    again = arun(run_service(kafka, until=len(expected), restart=True))
    assert again.published == 0 and again.already_published == len(expected)
    # committed past: the restarted service did not read (nor dead-letter) them again
    assert len(arun(dead_letters(kafka, want=len(sent) + 1, consumer="incidents",
                                 limit_s=3))) == len(sent)


def test_incident_service_folds_duplicated_records_once(kafka: KafkaConfig) -> None:
    expected = rebuild(LOG, SETTINGS)
    arun(publish(kafka, LOG, twice=True))
    stats = arun(run_service(kafka, until=len(expected)))
    got = arun(transitions(kafka))
    assert stats.published == len(expected) and stats.conflicts == 0
    assert sorted(canonical(t) for t in got) == sorted(canonical(t) for t in expected)


# --- decide ---------------------------------------------------------------------------------

KEY = keys.COMMAND


def _pool_and_straggler(job: str, t: int) -> list[Event]:
    out = [make_event(PoolUnit(unit=f"u{r}", state=UnitState.BOUND, node="n1", rank=r,
                               pid=100 + r, epoch=1),
                      event_id=derived_id("u", job, r), job_id=job, event_time=t - 10 + r,
                      source="test", subject=Subject(unit=f"u{r}"))
           for r in range(4)]
    vid = derived_id("v", job, "straggler")
    out.append(make_event(Verdict(verdict_id=vid, rule="straggler", kind="straggler",
                                  state=VerdictState.OPEN, severity=Severity.WARNING,
                                  first_anomalous_time=t, decided_time=t, evidence={}),
                          event_id=derived_id("e", vid), job_id=job, event_time=t,
                          source="test", subject=Subject(rank=2, node="n1")))
    return signing.sign_log(out, keys.COMMAND, keys.ACTUATOR)  # what the actuator wrote


async def _decide_for(kafka: KafkaConfig, seconds: float) -> Decider:
    decider = Decider(KafkaBus(kafka), DeciderOptions(key=KEY, actuators=keys.ACTUATOR_PUBS,
                                                      policy=PolicyConfig(), tick_s=0.1))
    stop = asyncio.Event()
    task = asyncio.create_task(decider.run(stop))
    await asyncio.sleep(seconds)
    assert not task.done(), "decide stopped"  # alive: it carried on past the poison
    stop.set()
    await task
    return decider


def _commands(kafka: KafkaConfig) -> list[Command]:
    return [e.payload for e in read_events(kafka, [TopicRole.COMMANDS])
            if isinstance(e.payload, Command)]


@pytest.mark.parametrize("twice", [False, True], ids=["poison", "duplicates"])
def test_decide_reads_past_poison_and_folds_duplicates_once(
        kafka: KafkaConfig, monkeypatch: pytest.MonkeyPatch, twice: bool) -> None:
    original = Decider.feed

    def feed(self: Decider, event: Event, now: int) -> list[Any]:
        if event.job_id == "job-boom":  # a record the policy cannot fold
            raise KeyError("u9")
        return original(self, event, now)

    monkeypatch.setattr(Decider, "feed", feed)
    t = now_us()
    events = _pool_and_straggler("job-decide", t)
    boom = _pool_and_straggler("job-boom", t)[-1:]
    sent = arun(publish(kafka, events if twice else [*boom, *events],
                        poison_at=() if twice else (1, 5), twice=twice))
    arun(_decide_for(kafka, 6.0))
    commands = _commands(kafka)
    assert [(c.action, c.tier, c.params.rank) for c in commands] == [
        (CommandAction.RAISE_QUOTA, 1, 2)]
    letters = arun(dead_letters(kafka, want=len(sent) + (not twice), consumer="decide",
                                limit_s=5))
    raised = [d for d in letters if d.field == "<handler>"]
    assert_dead_lettered([d for d in letters if d not in raised], sent)
    if not twice:
        assert len(raised) == 1 and "handling it raised KeyError: 'u9'" in raised[0].reason
        assert b"job-boom" in raised[0].original_value()
    arun(_decide_for(kafka, 4.0))  # a restart reads it all again: no crash, nothing new
    assert len(_commands(kafka)) == 1


# --- alerts run -------------------------------------------------------------------------------

@pytest.mark.parametrize("twice", [False, True], ids=["poison", "duplicates"])
def test_alerts_send_one_notice_per_incident_past_poison_and_duplicates(
        kafka: KafkaConfig, tmp_path: Path, twice: bool) -> None:
    from tests.integration.test_alerts_chat import TITLE, opening, title_of
    from trainguard.alerts.config import load
    from trainguard.alerts.service import AlertsService, ServiceOptions
    from trainguard.dev.webhook_receiver import Route, WebhookReceiver

    incs = [f"poison-{i}" for i in range(3)]
    events = [ev for inc in incs for ev in opening("job-alerts", inc)]

    async def run_for(service: AlertsService, done: Callable[[], bool], limit_s: float) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while loop.time() < deadline and not done():
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.5)  # anything extra would arrive now
        assert not task.done(), "the alerts service stopped"
        stop.set()
        await asyncio.wait_for(task, 20)

    with WebhookReceiver([Route("hook", "/hook/")]) as rx:
        path = tmp_path / "alerts.yaml"
        path.write_text("coalesce: {hold_s: 0.3}\nchannels:\n"
                        f"  - {{name: hook, type: webhook, url: '{rx.url('/hook/x')}'}}\n")
        config = load(path)

        def service() -> AlertsService:
            return AlertsService(config, KafkaBus(kafka), ServiceOptions(
                group_id=f"{kafka.topic_prefix}-alerts", from_offset="earliest"))

        def titles() -> list[str]:
            return sorted(m.group(1) + " " + m.group(3) for r in rx.records("hook")
                          if (m := TITLE.match(title_of(r))) is not None)

        sent = arun(publish(kafka, events, poison_at=() if twice else spread(events),
                            twice=twice))
        arun(run_for(service(), lambda: len(rx.records("hook")) >= len(incs), 30), 60)
        assert titles() == sorted(f"FAULT INC-{inc}" for inc in incs)
        letters = arun(dead_letters(kafka, want=len(sent), consumer="trainguard-alerts",
                                    limit_s=5))
        assert_dead_lettered(letters, sent)
        arun(run_for(service(), lambda: False, 3), 60)  # a restart: nothing again
        assert len(rx.records("hook")) == len(incs)
    assert len(arun(dead_letters(kafka, want=len(sent) + 1, consumer="trainguard-alerts",
                                 limit_s=3))) == len(sent)


# --- metrics serve ----------------------------------------------------------------------------

@pytest.mark.parametrize("twice", [False, True], ids=["poison", "duplicates"])
def test_metrics_count_every_valid_event_once_and_the_poison_as_invalid(
        kafka: KafkaConfig, twice: bool) -> None:
    from trainguard.metrics.recorder import Recorder
    from trainguard.metrics.registry import PipelineMetrics
    from trainguard.metrics.service import MetricsService

    events = LOG[:150]
    sent = arun(publish(kafka, events, poison_at=() if twice else spread(events), twice=twice))
    recorder = Recorder(PipelineMetrics())
    reg = recorder.metrics.registry

    def total(name: str) -> float:
        return sum(s.value for m in reg.collect() for s in m.samples if s.name == name)

    async def scenario() -> None:
        service = MetricsService(KafkaBus(kafka), recorder,
                                 group_id=f"{kafka.topic_prefix}-metrics",
                                 from_offset="earliest")
        task = asyncio.create_task(service.run())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while loop.time() < deadline and total("trainguard_events_total") < len(events):
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.5)  # anything extra would be counted now
        assert not task.done(), "the metrics service stopped"
        service.stopping.set()
        await asyncio.wait_for(task, 20)

    arun(scenario(), 60)
    assert total("trainguard_events_total") == len(events)
    assert total("trainguard_invalid_records_total") == len(sent)


# --- streams (the faust worker) -------------------------------------------------------------

def test_streams_worker_evaluates_past_poison_and_duplicates_and_restarts(
        kafka: KafkaConfig, tmp_path: Path) -> None:
    from tests.integration.test_streams_worker import (
        _assert_same_verdicts,
        _expected,
        _scenario,
        _verdicts,
        _worker,
    )

    events = _scenario()
    expected = _expected(events)  # as if every record came once and nothing else came
    want = sum(len(v) for v in expected.values())
    sent = arun(publish(kafka, events, poison_at=spread(events), twice=True), 120)

    def stop(worker: subprocess.Popen[bytes]) -> None:
        # a clean stop commits what was read; a killed worker reads its uncommitted tail
        # again, poison included (which the restart below would count as letters twice)
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(90)
        except subprocess.TimeoutExpired:
            worker.kill()
            raise AssertionError("the worker did not stop within 90 s of SIGTERM") from None

    worker = _worker(kafka, tmp_path / "w1")
    try:
        got = arun(_verdicts(kafka, want, limit_s=120), timeout_s=150)
        assert worker.poll() is None, "the worker exited"
    finally:
        stop(worker)
    _assert_same_verdicts(got, events)  # every valid record evaluated once, in order
    letters = arun(dead_letters(kafka, want=len(sent), consumer="streams.evaluate"))
    assert_dead_lettered(letters, sent)

    # a restart: the committed poison is not read again; new poison is dead-lettered too
    worker = _worker(kafka, tmp_path / "w2")
    try:
        more = arun(publish(kafka, events[-1:], poison_at=(0,)))
        letters = arun(dead_letters(kafka, want=len(sent) + len(more),
                                    consumer="streams.evaluate", limit_s=90), 120)
        time.sleep(1.0)
        assert worker.poll() is None, "the restarted worker exited"
    finally:
        stop(worker)
    assert_dead_lettered(letters, [*sent, *more])


# --- actuator -------------------------------------------------------------------------------

def test_actuator_dead_letters_poison_and_a_command_that_crashes_it_and_carries_on(
        kafka: KafkaConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.integration.test_actuator_commands import KEY as ACT_KEY
    from tests.integration.test_actuator_commands import command, outcomes_until
    from tests.integration.test_fencing import job_spec
    from trainguard.actuators.fencing import identify, stop_process
    from trainguard.actuators.local import LocalBackend
    from trainguard.actuators.service import Actuator, ActuatorOptions
    from trainguard.events.payloads import CommandOutcome, OutcomeStatus, StepReport

    spec = job_spec(tmp_path, world=1, ignore_term=False)
    job = spec.job_id
    original = Actuator.handle

    async def handle(self: Actuator, ex: object, event: Event) -> None:
        assert isinstance(event.payload, Command)
        if event.payload.idempotency_key == "k-boom":  # as a non-ASCII signature did
            raise TypeError("comparing strings with non-ASCII characters is not supported")
        await original(self, ex, event)  # type: ignore[arg-type]

    monkeypatch.setattr(Actuator, "handle", handle)

    def actuator() -> Actuator:
        return Actuator(KafkaBus(kafka), ActuatorOptions(job=spec, key=keys.COMMAND_PUB,
                                               signer=keys.ACTUATOR, launch=True,
                                               state_dir=tmp_path / "state", max_age_s=60),
                        LocalBackend(tmp_path / "logs", use_cgroups=False))

    def good_done(got: list[Event]) -> bool:
        return any(isinstance(e.payload, CommandOutcome) and e.payload.idempotency_key ==
                   "k-good" and e.payload.status is OutcomeStatus.DONE for e in got)

    report = make_event(StepReport(rank=0, world_size=1, step=1, samples_consumed=1,
                                   compute_ms=1.0, binding_epoch=1),
                        event_id=derived_id("step", job), job_id=job, event_time=now_us(),
                        source="test", subject=Subject(rank=0, node="test-node"))
    first = actuator()

    async def scenario() -> tuple[list[Event], list[Poison]]:
        stop = asyncio.Event()
        task = asyncio.create_task(first.run(stop))
        while first.executor is None or not first.executor.pool.bound(job):
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)  # the commands consumer joins its group
        cmds = [command(job, k, CommandAction.RESUME, 0, signed_with=ACT_KEY)
                for k in ("k-boom", "k-accent", "k-good")]
        accent = cmds[1].payload
        assert isinstance(accent, Command) and accent.signature
        # the reproduction: a signature with a non-ASCII character (with HMAC signatures
        # it made compare_digest raise; whatever the scheme, it must not stop the actuator)
        cmds[1] = cmds[1].model_copy(update={"payload": accent.model_copy(
            update={"signature": accent.signature[:-1] + "\u00e9"})})
        sent = await publish(kafka, [*cmds, report], poison_at=(0, 2))
        got = await outcomes_until(kafka, 0, done=good_done)
        assert not task.done(), "the actuator stopped"
        stop.set()
        await task
        again = actuator()  # a restart: nothing committed is read again, nothing crashes
        stop = asyncio.Event()
        task = asyncio.create_task(again.run(stop))
        await asyncio.sleep(5.0)
        assert not task.done(), "the restarted actuator stopped"
        stop.set()
        await task
        return got, sent

    try:
        got, sent = arun(scenario(), timeout_s=90)
    finally:
        if first.executor is not None:
            for rep in first.executor.replicas().values():
                ident = identify(rep.pid)  # test cleanup: whatever that pid is now
                if ident is not None:
                    stop_process(ident, 0.1)
    outcomes = [(e.payload.idempotency_key, e.payload.status) for e in got
                if isinstance(e.payload, CommandOutcome)]
    accent_refused = outcomes.count(("k-accent", OutcomeStatus.REFUSED))
    assert [o for o in outcomes if o[0] != "k-accent"] == [
        ("k-good", OutcomeStatus.ACCEPTED), ("k-good", OutcomeStatus.DONE)]
    task_topic = f"{kafka.topic_prefix}.task"
    letters = arun(dead_letters(kafka, want=len(sent) + 2 - accent_refused, limit_s=10))
    raised = [d for d in letters if d.field == "<handler>"]
    boom = [d for d in raised if b"k-boom" in d.original_value()]
    assert len(boom) == 1 and boom[0].consumer == "actuator"
    assert "TypeError: comparing strings" in boom[0].reason
    # its signature does not verify: dead-lettered by the consumer's check (or refused), once
    accent_letters = [d for d in letters if b"k-accent" in d.original_value()]
    assert accent_refused + len(accent_letters) == 1
    assert len(raised) == 1 + sum(d.field == "<handler>" for d in accent_letters)
    assert_dead_lettered([d for d in letters if d.consumer == "actuator" and d not in raised
                          and d not in accent_letters],
                         [p for p in sent if p.topic != task_topic])
    assert_dead_lettered([d for d in letters if d.consumer == "actuator-epochs"],
                         [p for p in sent if p.topic == task_topic])
    # the restart dead-lettered nothing again
    assert len(letters) == len(sent) + len(raised) + len([d for d in accent_letters
                                                         if d not in raised])


# --- a late copy of an old pool event (same bytes, a later offset) --------------------------

@pytest.mark.parametrize("reader", ["actuator", "decide"])
def test_a_late_copy_of_an_old_pool_event_does_not_undo_the_newer_one(
        kafka: KafkaConfig, tmp_path: Path, reader: str) -> None:
    from tests.integration.test_fencing import job_spec
    from trainguard.actuators.local import LocalBackend
    from trainguard.actuators.pool import PoolState
    from trainguard.actuators.service import Actuator, ActuatorOptions

    spec = job_spec(tmp_path, world=1)
    job = spec.job_id
    t = now_us()

    def unit(state: UnitState, at: int) -> Event:
        bound = state is UnitState.BOUND
        return make_event(PoolUnit(unit="u0", state=state, node="test-node",
                                   rank=0 if bound else None, pid=4242 if bound else None,
                                   epoch=1 if bound else None),
                          event_id=derived_id("pool", job, state.value), job_id=job,
                          event_time=at, source="trainguard-actuator",
                          subject=Subject(unit="u0"))  # signed below

    bound, fenced = signing.sign_log([unit(UnitState.BOUND, t), unit(UnitState.FENCED, t + 1)],
                                     keys.COMMAND, keys.ACTUATOR)

    async def scenario() -> PoolState:
        await publish(kafka, [bound])
        await publish(kafka, [fenced])
        await publish(kafka, [bound])  # the producer's retry of the first, after the second
        if reader == "decide":
            return (await _decide_for(kafka, 3.0)).state.pool
        actuator = Actuator(KafkaBus(kafka), ActuatorOptions(job=spec, key=keys.COMMAND_PUB,
                                                   signer=keys.ACTUATOR,
                                                   state_dir=tmp_path / "s"),
                            LocalBackend(tmp_path / "logs", use_cgroups=False))
        actuator.producer = EventProducer(kafka)
        await actuator.producer.start()
        try:
            return (await actuator._rebuild()).pool
        finally:
            await actuator.producer.stop()

    pool = arun(scenario())
    assert pool.units["u0"].state is UnitState.FENCED
    assert pool.bound(job) == {}
