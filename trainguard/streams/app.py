"""The faust app: one agent (``evaluate``) feeds every job's events to that job's rule engine
in order and publishes the verdicts; a second (``urgent``) feeds the urgent copies of exits and
node health to the same engines' prompt lane, so they are decided ahead of any backlog
(``Lanes``; docs/rules.md, "The urgent lane").

Partitioning: the telemetry, task and urgent topics are keyed by job and have the same
partition count, so all of one job's events meet in one worker, read straight from the topics
(no re-keying hop: each record is consumed once and never copied).
State: each job's engine state lives in a faust table (changelog-backed), written once per
consumed batch; the events waiting in its reorder buffer are written once each, in chunks
(``state.py``), not re-serialised with every snapshot. A partitioner that hashes only the part
of a key before the first NUL keeps a job's keys on the job's partition (plain keys hash
exactly as Kafka's default). The app runs with ``processing_guarantee=exactly_once``: verdicts
and dead letters (sent in the transaction of the record that caused them, ``sends.py``), table
updates and consumed offsets commit together in one Kafka transaction, so a worker killed
mid-run and started again resumes from the changelog and neither misses nor repeats a
verdict.
Windows are the engines' own, in event time (faust's windows close on the wall clock and
drop late events, which would make live processing and replay disagree).
Bindings: with ``check`` (``signing.Trust.check`` over the trusted actuator keys) the worker
also reads the outcomes topic (keyed by job, as many partitions) and feeds the engines the
``pool.unit`` events whose actuator signature verifies: the only source of binding epochs.
Records of a signed type that do not verify are dead-lettered with the reason; other outcome
types are no rule input and are skipped. Without ``check`` no binding is believed at all.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeAlias

import faust
from aiokafka.partitioner import murmur2

from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import Check
from trainguard.bus.dlq import dead_letter, refusal
from trainguard.bus.headers import spooled_us
from trainguard.events.clock import now_us
from trainguard.events.codec import decode, encode
from trainguard.events.errors import ContractError, FieldError
from trainguard.events.registry import SIGNED_TYPES, URGENT_TYPES
from trainguard.events.topics import TopicNames, TopicRole
from trainguard.rules.engine import RULE_INPUTS
from trainguard.streams.engine import EngineFactory, JobEngine
from trainguard.streams.limits import BUFFER_RECORDS, FETCH_BYTES
from trainguard.streams.sends import CommitSoon, Send, TransactionalSend
from trainguard.streams.state import JobStore, Recorded

log = logging.getLogger(__name__)

URGENT_WITHIN_S = 0.005  # an urgent copy waits at most this long for others to batch with
# A batch of the log is decided in one go on the event loop (~0.5 ms per node record): every
# this many records it lets the other tasks run, so an urgent copy is fetched and takes its
# turn within a few ms instead of after the whole batch.
YIELD_EVERY = 32
# the jobs a batch touched: engine, store, and the ids it had buffered when the batch began
Touched: TypeAlias = dict[str, tuple[JobEngine, JobStore, set[str]]]
# (key, value, the faust message it came from: its transaction carries the send)
Out: TypeAlias = list[tuple[bytes, bytes, Any]]


def job_partitioner(key: bytes | None, all_partitions: Sequence[int],
                    available: Sequence[int]) -> int:
    """Kafka's default (murmur2) over the key up to its first NUL: ``job`` and
    ``job\0ch\0n`` land on the same partition; keys without a NUL hash as usual."""
    if key is None:
        return random.choice(list(available or all_partitions))
    head = key.split(b"\0", 1)[0]
    index: int = murmur2(head) & 0x7FFFFFFF
    return all_partitions[index % len(all_partitions)]


def build_app(
    cfg: KafkaConfig,
    engines: EngineFactory,
    *,
    partitions: int,
    app_id: str | None = None,
    datadir: Path | None = None,
    web_port: int | None = None,
    web_addr: str = "127.0.0.1",
    batch_size: int = 1000,
    batch_within_s: float = 0.05,
    commit_interval_s: float = 0.2,
    check: Check | None = None,
    buffer_records: int = BUFFER_RECORDS,
    fetch_bytes: int = FETCH_BYTES,
) -> faust.App:
    """``partitions``: the task topic's partition count on the broker (the telemetry topic's
    must be the same, see ``cli/streams.py``); the table's changelog gets the same, as faust
    requires of co-partitioned topics.

    Latency: a verdict is visible to read-committed consumers once the transaction that sent
    it commits, so ``commit_interval_s`` (plus up to ``batch_within_s`` of batching) bounds
    what the worker adds to the rules' own decision time.

    ``buffer_records`` (faust's ``stream_buffer_maxsize``) and ``fetch_bytes`` (per partition
    and fetch) bound how far the urgent copies can sit behind the log's records in the one
    consumer both agents share (``BUFFER_RECORDS``).

    faust's web view (``web_port``; off by default) listens on ``web_addr`` only, loopback
    unless told otherwise: it shows the worker's tables and internals, without authentication."""
    names = TopicNames(cfg.topic_prefix)
    app = faust.App(
        app_id or f"{cfg.topic_prefix}-streams",
        **cfg.faust_broker_kwargs(),
        store="memory://",  # tables are rebuilt from their changelog topics
        processing_guarantee="exactly_once",
        topic_replication_factor=cfg.replication_factor,
        topic_partitions=partitions,
        web_enabled=web_port is not None,
        web_port=web_port or 6066,
        web_bind=web_addr,  # faust's default is every interface
        datadir=str(datadir) if datadir else None,
        consumer_auto_offset_reset="earliest",
        broker_commit_every=max(batch_size, 500),
        broker_commit_interval=commit_interval_s,
        producer_partitioner=job_partitioner,
        # Node records are ~5 KB: faust's default 16 KB producer batch sent three per
        # request, and every request is a socket write and a round trip in the one event loop.
        producer_max_batch_size=1 << 20,
        producer_linger=0.005,
        consumer_max_fetch_size=fetch_bytes,
        stream_buffer_maxsize=buffer_records,
        key_serializer="raw",  # also the table's: job ids as bytes, hashed like the records
        value_serializer="raw",
    )
    raw = {"key_serializer": "raw", "value_serializer": "raw"}
    # use_partitioner: a job's snapshot goes to the changelog partition its key hashes to,
    # the same partition the job's records are on, whatever event is current in a batch.
    state = app.Table("engine-state", default=None, partitions=partitions, key_type=bytes,
                      value_type=bytes, use_partitioner=True,
                      extra_topic_configs={"min.insync.replicas": str(cfg.min_insync_replicas)})
    lanes = Lanes(engines, state, TransactionalSend(app), names, check)
    roles = [TopicRole.TASK, TopicRole.TELEMETRY] + ([TopicRole.OUTCOMES] if check else [])

    @app.agent(app.topic(*[names.name(r) for r in roles], **raw), name="evaluate")
    async def evaluate(stream: Any) -> None:
        async for batch in stream.take_events(batch_size, within=batch_within_s):
            await lanes.ordered_batch(batch)

    prompt = CommitSoon(lambda: app.consumer.commit())

    @app.agent(app.topic(names.name(TopicRole.URGENT), **raw), name="urgent")
    async def urgent(stream: Any) -> None:
        async for batch in stream.take_events(batch_size, within=URGENT_WITHIN_S):
            await lanes.urgent_batch(batch)
            prompt.request()  # its verdicts readable now, not at the next commit tick

    @app.on_rebalance_complete.connect
    async def forget(sender: Any, **kwargs: Any) -> None:
        # Another worker may have moved a job's state on; re-read it from the table.
        lanes.live.clear()

    del evaluate, urgent, forget  # registered on the app by their decorators
    return app


class Lanes:
    """What the worker's two agents share: the job engines, the table and its pending
    changelog writes, and whose turn it is.

    - ``ordered_batch``: records of the log (task, telemetry, verified outcomes) fed to their
      job's engine in order. Each job's snapshot is written once per batch, not once per
      event; the batch's offsets, verdicts and snapshots still commit in one transaction.
    - ``urgent_batch``: the urgent copies, decided by the prompt lane on arrival
      (``RuleEngine.early``); the originals reach ``ordered_batch`` in order, which confirms or
      retracts. Nothing there is buffered, so it saves only the prompt lane's book.

    They take turns a whole batch at a time (decide, save, send, all awaited): a batch of one
    never commits state the other decided but has not sent yet. An ordered batch lets other
    tasks run every ``YIELD_EVERY`` records and, when an urgent batch waits, saves and sends
    what it has decided so far and lets it go first; the rest follows, and faust acks the whole
    batch after it, as before. No record stops an agent (a crashed agent leaves the worker up
    doing nothing, and the record is read again after a restart): one that is not an event, or
    whose evaluation raises, is dead-lettered with the reason."""

    def __init__(self, engines: EngineFactory, state: Any, send: Send, names: TopicNames,
                 check: Check | None) -> None:
        self.engines = engines
        self.state = state  # the faust table
        self.send = send
        self.verdicts = names.name(TopicRole.VERDICTS)
        self.dlq = names.name(TopicRole.DLQ)
        self.check = check
        self.live: dict[str, tuple[JobEngine, JobStore]] = {}
        self.turn = asyncio.Lock()
        self.waiting = 0  # urgent batches waiting for their turn
        self._table: Recorded | None = None

    def table(self) -> Recorded:
        if self._table is None:  # made on first use: the table's store exists by then
            self._table = Recorded(self.state.data)
        return self._table

    async def ordered_batch(self, batch: Sequence[Any]) -> None:
        i = 0
        while i < len(batch):
            async with self.turn:
                touched: Touched = {}
                raw: dict[str, bytes] = {}
                out: Out = []
                while i < len(batch):
                    await self._ordered(batch[i], touched, raw, out)
                    i += 1
                    if i % YIELD_EVERY == 0:
                        await asyncio.sleep(0)  # let the fetcher and the urgent agent run
                    if self.waiting:
                        break
                await self._finish(touched, raw, out)

    async def urgent_batch(self, batch: Sequence[Any]) -> None:
        self.waiting += 1
        try:
            await self.turn.acquire()
        finally:
            self.waiting -= 1
        try:
            touched: Touched = {}
            out: Out = []
            for ev in batch:
                await self._urgent(ev, touched, out)
            await self._finish(touched, {}, out)
        finally:
            self.turn.release()

    def _engine(self, job: str, touched: Touched) -> JobEngine:
        seen = touched.get(job)
        if seen is None:
            pair = self.live.get(job)
            if pair is None:
                store = JobStore(self.table(), job)
                pair = self.live[job] = (self.engines(job, store.load()), store)
            seen = touched[job] = (pair[0], pair[1], pair[0].buffered_ids())
        return seen[0]

    async def _ordered(self, ev: Any, touched: Touched, raw: dict[str, bytes],
                       out: Out) -> None:
        try:
            event = decode(ev.value)
        except ContractError as err:
            await self._refuse(err, ev.message, "streams.evaluate")
            return
        if event.type in SIGNED_TYPES:
            bad = self.check(event) if self.check is not None else "no trusted actuator keys"
            if bad is not None:
                sig = getattr(event.payload, "signature", None)
                await self._refuse(ContractError([FieldError("payload.signature", sig, bad)]),
                                   ev.message, "streams.evaluate")
                return
        if event.type not in RULE_INPUTS:
            return
        try:
            engine = self._engine(event.job_id, touched)
            # before feeding: an event buffered before its evaluation raised is saved with
            # the others
            raw[event.event_id] = ev.value
            key = event.job_id.encode()
            decided = [(key, encode(v), ev.message)
                       for v in engine.feed(event, spooled_us(ev.message.headers))]
        except Exception as exc:  # this record is poison: see the class doc
            await self._poison(exc, event, ev.message, "streams.evaluate")
            return
        out.extend(decided)

    async def _urgent(self, ev: Any, touched: Touched, out: Out) -> None:
        try:
            event = decode(ev.value)
        except ContractError as err:
            await self._refuse(err, ev.message, "streams.urgent")
            return
        if event.type not in URGENT_TYPES:
            await self._refuse(ContractError([FieldError(
                "type", event.type, "not an urgent type: the urgent topic holds copies of "
                f"{', '.join(sorted(URGENT_TYPES))} only")]), ev.message, "streams.urgent")
            return
        try:
            key = event.job_id.encode()
            decided = [(key, encode(v), ev.message)
                       for v in self._engine(event.job_id, touched).early(event)]
        except Exception as exc:  # poison, as in _ordered
            await self._poison(exc, event, ev.message, "streams.urgent")
            return
        out.extend(decided)

    async def _finish(self, touched: Touched, raw: dict[str, bytes],
                      out: Out) -> None:
        # Everything a batch decided is sent, awaited, in the open transaction, before faust
        # acks the batch's events: a commit can never hold the batch's offsets without its
        # state. (Table assignments would go through faust's send-soon buffer, which an
        # exactly-once commit does not flush: a worker killed right after a commit lost its
        # state.)
        for engine, store, before in touched.values():
            store.save(engine, before, raw)
        for key, value, source in out:
            await self.send(self.verdicts, key, value, source)
        for key, change in self.table().take():
            await self.state.changelog_topic.send(key=key, value=change)

    async def _refuse(self, err: ContractError, message: Any, consumer: str) -> None:
        letter = dead_letter(err, topic=str(message.topic), partition=int(message.partition),
                             offset=int(message.offset),
                             key=message.key, value=message.value or b"",
                             rejected_at=now_us(), consumer=consumer)
        await self.send(self.dlq, message.key, letter.encode(), message)

    async def _poison(self, exc: Exception, event: Any, message: Any, consumer: str) -> None:
        log.error("streams: evaluating %s %s raised %s: %s; dead-lettered",
                  event.type, event.event_id, type(exc).__name__, exc)
        log.debug("streams: the traceback", exc_info=exc)
        await self._refuse(refusal(exc), message, consumer)
