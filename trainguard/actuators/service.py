"""`trainguard actuator`: the bus edge around the executor (Kafka in production,
``bus/memory.py`` in unit tests: a ``Bus`` from ``bus/protocol.py``).

At start it reads the outcomes topic from the beginning: the pool (``pool.unit``) and the used
idempotency keys (``command.outcome``) are rebuilt from the log, merged with the local ledger
file. Only events signed by a trusted actuator key (its own, plus ``trusted``) are believed;
the rest are dead-lettered. Every outcome, pool event and refusal it writes is signed with its
own key (``signing.sign_event``, in the publisher). It registers the job spec's units, finishes
the command its journal shows in flight (an actuator killed mid-command: ``Executor.recover``;
the command's outcome is published then), optionally launches the job, then consumes:
- the commands topic (consumer group per job): a command whose signature does not verify with
  decide's public key is dead-lettered (no outcome: a forgery gets no say about the key it
  names). A verified command acts when its idempotency key is unused and it is fresh; it gets
  ``accepted`` then ``done``/``failed``, or one ``refused``/``timed_out`` outcome. A refusal
  never uses up a key;
- the task topic (no group, from now): step reports and heartbeats with a stale binding epoch
  are refused (``replica.refused``); the process is killed only if the replica journal
  recorded exactly that replica and proves it alive (pidfd + start time + boot id).
Between polls, about every ``watch_s``, a backend whose job lives in a scheduler's allocation
(``WatchesAllocation``: Slurm) is asked whether the scheduler ended it; the first time it has,
``job.ended`` goes on the log (once: a restarted actuator finds it there).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path

from aiokafka.errors import KafkaError

from trainguard.actuators import metrics, signing, zygote
from trainguard.actuators.backend import Backend, WatchesAllocation
from trainguard.actuators.executor import SOURCE, Emit, Executor, Result, fault_from_env
from trainguard.actuators.jobspec import JobSpec
from trainguard.actuators.journal import Journal, in_flight, phase_record
from trainguard.actuators.ledger import Ledger
from trainguard.actuators.pool import rebuild
from trainguard.bus.consumer import Delivered
from trainguard.bus.protocol import Bus, EventSink, EventSource
from trainguard.events.clock import now_us
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    ActionData,
    Command,
    CommandOutcome,
    FenceData,
    JobEnded,
    OutcomeStatus,
    RestartData,
    no_data,
)
from trainguard.events.registry import SIGNED_TYPES, Signer
from trainguard.events.topics import TopicRole

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ActuatorOptions:
    job: JobSpec
    key: signing.KeySet  # decide's public key(s): commands
    signer: signing.PrivateKey  # this actuator's own key: its outcomes and pool events
    state_dir: Path
    trusted: signing.KeySet = field(default_factory=signing.KeySet)  # other actuators' keys
    launch: bool = False
    max_age_s: float = 60.0
    group_id: str | None = None
    watch_s: float = 1.0  # how often the scheduler is asked whether it ended the allocation


class Actuator:
    def __init__(self, bus: Bus, opts: ActuatorOptions, backend: Backend) -> None:
        self.bus = bus
        self.opts = opts
        self.backend = backend
        self.producer: EventSink | None = None  # made inside the running loop
        self.ledger = Ledger(opts.state_dir / f"ledger-{opts.job.job_id}.jsonl")
        self.journal = Journal(opts.state_dir / f"commands-{opts.job.job_id}.journal")
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.executor: Executor | None = None
        self.busy = False
        self._pub: asyncio.Task[None] | None = None  # the publisher, while run() runs
        self.trust = signing.Trust(
            decide=opts.key,
            actuators=opts.trusted | signing.KeySet.of([opts.signer.public()]))

    def _emit_threadsafe(self, loop: asyncio.AbstractEventLoop) -> Emit:
        def emit(event: Event) -> None:
            loop.call_soon_threadsafe(self.queue.put_nowait, event)
        return emit

    async def _publisher(self) -> None:
        while True:
            event = await self.queue.get()
            if SIGNED_TYPES.get(event.type) is Signer.ACTUATOR:
                event = signing.sign_event(self.opts.signer, event)
            await self._prod().send(event)
            if event.type == "replica.refused":
                metrics.REFUSED_REPLICAS.labels(getattr(event.payload, "action", "?")).inc()
            self.queue.task_done()

    def _start_publisher(self) -> None:
        self._pub = asyncio.create_task(self._publisher(), name="actuator-publisher")

    async def _published(self) -> None:
        """Every queued event is on the log. A publisher that failed (the broker refused a
        send) raises its error here rather than leaving this wait hanging for ever."""
        pub = self._pub
        assert pub is not None, "the publisher is started first"
        join = asyncio.ensure_future(self.queue.join())
        done, _ = await asyncio.wait({join, pub}, return_when=asyncio.FIRST_COMPLETED)
        if join in done:
            return
        join.cancel()
        pub.result()  # re-raises what stopped it
        raise RuntimeError("the event publisher stopped with events still queued")

    def _stop_publisher(self) -> None:
        if self._pub is not None:
            self._pub.cancel()
            self._pub = None

    async def _rebuild(self) -> Executor:
        job = self.opts.job.job_id
        reader = self.bus.consumer([TopicRole.OUTCOMES], group_id=None,
                                   name="actuator-rebuild", dlq=self.producer, dedupe=True,
                                   check=self.trust.check)
        await reader.start()
        try:
            history = [d.event for d in await reader.drain(idle_ms=500, limit_s=300)]
            # a partial pool could launch a second copy of a running job: never act on one
            if not await reader.caught_up():
                raise RuntimeError("could not read the outcomes topic to its end within "
                                   "300 s: the pool cannot be rebuilt, refusing to act")
        finally:
            await reader.stop()
        mine = [e for e in history if e.job_id == job]
        for e in mine:
            if isinstance(e.payload, CommandOutcome):
                self.ledger.note_outcome(e.payload)
        loop = asyncio.get_running_loop()
        executor = Executor(self.opts.job, self.backend,
                            self._emit_threadsafe(loop),
                            rebuild(mine), self.journal, fault_from_env())
        # said already (by this actuator before a restart): never said twice
        executor.ended = next((e.payload for e in mine if isinstance(e.payload, JobEnded)), None)
        if self.journal.skipped:
            log.warning("actuator %s: %d corrupt record(s) of %s skipped", job,
                        self.journal.skipped, self.journal.path)
        log.warning("actuator %s: rebuilt %d units, %d used keys from the log", job,
                    len(executor.pool.units), len(self.ledger.entries))
        return executor

    def _prod(self) -> EventSink:
        assert self.producer is not None, "run() starts the producer"
        return self.producer

    async def run(self, stop: asyncio.Event) -> None:
        self.producer = self.bus.producer()
        await self.producer.start()
        self._start_publisher()
        try:
            self.executor = ex = await self._rebuild()
            ex.register_units()
            await self._recover(ex)
            running = self.backend.live(self.opts.job)
            if self.opts.launch and ex.pool.job_epoch(self.opts.job.job_id) == 0 and running:
                log.error("actuator: job %s not launched: the log has never seen it bound, but "
                          "replicas its journal recorded are alive (pids %s); stop them with "
                          "--teardown first", self.opts.job.job_id,
                          ", ".join(str(r.pid) for r in running))
            elif self.opts.launch and ex.pool.job_epoch(self.opts.job.job_id) == 0:
                epoch = await asyncio.to_thread(ex.launch_initial)
                log.warning("actuator: launched job %s at epoch %d", self.opts.job.job_id,
                            epoch)
            await self._published()
            await self._serve(ex, stop)
        finally:
            try:
                await self._published()
            finally:
                self._stop_publisher()
                await self.producer.stop()

    async def _recover(self, ex: Executor) -> None:
        """Finish the command an earlier actuator was killed in (if any), and say how it
        ended on the log like any command."""
        done = await asyncio.to_thread(ex.recover)
        if done is None:
            return
        log.warning("actuator %s: %s", self.opts.job.job_id, done.result.detail)
        cmd = done.command
        if cmd is not None:
            self.ledger.record(cmd.idempotency_key, cmd.command_id, done.result.status.value)
            await self._outcome(None, cmd, done.result.status, done.result.detail,
                                data=done.result.data)
        await self._published()

    async def teardown(self) -> list[str]:
        """Stop the job for good: fence every bound replica and every replica the journal
        knows and proves alive (confirmed dead, units released, each a ``pool.unit fenced``
        event), close the command in flight (never finished later) and stop the warm
        launcher. What was released."""
        self.producer = self.bus.producer()
        await self.producer.start()
        self._start_publisher()
        try:
            ex = await self._rebuild()
            released, _ = await asyncio.to_thread(ex.fence_all, None, "teardown")
            pending = in_flight(self.journal)  # torn down: never finished by a later start
            if pending is not None:
                self.journal.append(phase_record(pending.cid, "done", "torn_down"))
            await self._published()
        finally:
            self._stop_publisher()
            await self.producer.stop()
        logs = self.opts.job.log_dir or self.opts.state_dir / "logs"
        zygote.stop(logs / f"zygote-{self.opts.job.job_id}.sock")
        return released

    async def _serve(self, ex: Executor, stop: asyncio.Event) -> None:
        job = self.opts.job.job_id
        group = self.opts.group_id or f"{self.bus.names.prefix}-actuator-{job}"
        # Commands are not deduplicated here: the ledger refuses a command seen again
        # ("replayed"), and that refusal is on the log for whoever replayed a signed command.
        commands = self.bus.consumer([TopicRole.COMMANDS], group_id=group, name="actuator",
                                     dlq=self.producer, check=self.trust.check)
        task = self.bus.consumer([TopicRole.TASK], group_id=None, name="actuator-epochs",
                                 dlq=self.producer, from_offset="latest")
        await commands.start()
        await task.start()
        watched = 0.0
        watches = isinstance(self.backend, WatchesAllocation)  # else: no thread hop each second
        try:
            while not stop.is_set():
                if watches and ex.ended is None and \
                        time.monotonic() - watched >= self.opts.watch_s:
                    watched = time.monotonic()
                    await asyncio.to_thread(ex.watch_allocation)
                for d in await commands.poll(timeout_ms=200):
                    if d.event.job_id == job and isinstance(d.event.payload, Command):
                        await self._guarded(commands, d, self.handle(ex, d.event))
                    await commands.commit()
                if commands.uncommitted:  # a batch of refused records only: past them too
                    await commands.commit()
                for d in await task.poll(timeout_ms=50):
                    await self._guarded(task, d, self._check_report(ex, d.event))
        finally:
            await commands.stop()
            await task.stop()

    @staticmethod
    async def _check_report(ex: Executor, event: Event) -> None:
        ex.check_report(event)

    async def _guarded(self, consumer: EventSource, item: Delivered,
                       handling: Awaitable[None]) -> None:
        """Handle one record; if that raises, the record is poison: dead-lettered with the
        reason and logged, and the caller commits past it (a command that crashed the
        actuator would crash it again after every restart). Only a failure of the actuator's
        own publishing (the broker) stops it: that is no fault of the record."""
        try:
            await handling
        except KafkaError:
            raise
        except Exception as exc:
            if self._pub is None or self._pub.done():
                raise  # the publisher is gone: nothing more can be reported; restart
            await consumer.refuse(item, exc)

    async def _outcome(self, event: Event | None, cmd: Command, status: OutcomeStatus,
                       detail: str, started: int | None = None,
                       data: ActionData | None = None) -> None:
        payload = CommandOutcome(command_id=cmd.command_id, idempotency_key=cmd.idempotency_key,
                                 action=cmd.action, status=status, started_at=started,
                                 finished_at=now_us() if status is not OutcomeStatus.ACCEPTED
                                 else None, detail=detail[:4000],
                                 data=data if data is not None else no_data(cmd.action))
        ev = make_event(payload, event_id=derived_id("outcome", cmd.idempotency_key,
                                                     status.value, cmd.command_id),
                        job_id=self.opts.job.job_id, event_time=now_us(), source=SOURCE,
                        subject=event.subject if event is not None else Subject())
        metrics.OUTCOMES.labels(cmd.action.value, status.value).inc()
        await self.queue.put(ev)
        await self._published()  # the outcome is on the log before the next command

    async def handle(self, ex: Executor, event: Event) -> None:
        cmd = event.payload
        assert isinstance(cmd, Command)
        bad = signing.verify(self.opts.key, event)
        if bad is not None:  # the consumer dead-letters these; never an outcome, never a key
            log.warning("ignored command %s: %s", cmd.command_id, bad)
            return
        seen = self.ledger.seen(cmd.idempotency_key)
        if seen is not None:
            if seen.status == "started":
                detail = ("interrupted: the actuator stopped while carrying it out; not "
                          "repeated (the pool state on the log says what was done)")
                self.ledger.record(cmd.idempotency_key, cmd.command_id, "timed_out")
                await self._outcome(event, cmd, OutcomeStatus.TIMED_OUT, detail)
            else:
                await self._outcome(event, cmd, OutcomeStatus.REFUSED,
                                    f"replayed: idempotency key already used (outcome "
                                    f"{seen.status}, command {seen.command_id})")
            return
        stale = signing.freshness(cmd, now_us(), max_age_s=self.opts.max_age_s)
        if stale is not None:  # refused, not recorded: a refusal never uses up a key
            await self._outcome(event, cmd, OutcomeStatus.REFUSED, stale)
            return
        started = now_us()
        self.ledger.record(cmd.idempotency_key, cmd.command_id, "started")  # write-ahead
        await self._outcome(event, cmd, OutcomeStatus.ACCEPTED, "verified: signature, fresh, "
                            "unused idempotency key", started)
        self.busy = True
        try:
            result: Result = await asyncio.to_thread(ex.execute, cmd)
        finally:
            self.busy = False
        self.ledger.record(cmd.idempotency_key, cmd.command_id, result.status.value)
        d = result.data
        phases = {"fence": d.fence_ms, "bind": d.bind_ms if isinstance(d, RestartData) else None
                  } if isinstance(d, RestartData | FenceData) else {}
        for phase, ms in phases.items():
            if ms is not None:
                metrics.PHASE.labels(phase).observe(ms / 1000)
        metrics.PHASE.labels("command").observe((now_us() - started) / 1e6)
        await self._outcome(event, cmd, result.status, result.detail, started, result.data)
