"""Drains the spool into Kafka, in order, through outages.

Records are settled in the spool only once the broker acknowledged them (acks=all, idempotent
producer); a record whose send failed stays at the head and is sent again when Kafka is back,
so nothing is lost and per-partition order is kept.

A failed send has an unknown outcome: the broker may have written the batch and lost only the
acknowledgement (a broker stopped mid-request does that). Such records are *uncertain*; before
one is sent again, the publisher reads the tail of its topic and settles it without resending
if its exact bytes are already there. So an outage neither loses nor duplicates a record.
A record that waited in the spool says so in a header (``bus/headers.py``): the streams worker
holds its watermark while agents drain such a backlog.
The spool journals each send before it happens, so records sent by an agent that was then
killed are uncertain to the next one too (``DiskSpool.uncertain_at_open``).

The producer is idempotent (``PRODUCER_SETTINGS``), which covers the retries inside one
producer session; after an outage the publisher starts a new producer (a new producer id the
broker cannot match to the old one), so duplicates across that boundary are prevented only by
the reconciliation above, whose look-back is a window of the topic's tail, and only once the
old producer has stopped for good (``_close_producer``). Consumers that fold state dedupe by
event id for what gets past it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from trainguard.agent.metrics import AgentMetrics
from trainguard.agent.spool import DiskSpool, Spooled
from trainguard.bus.config import KafkaConfig
from trainguard.bus.headers import spooled_header
from trainguard.bus.producer import PRODUCER_SETTINGS

log = logging.getLogger(__name__)


class SpoolPublisher:
    def __init__(self, spool: DiskSpool, config: KafkaConfig, metrics: AgentMetrics, *,
                 batch: int = 1000, send_timeout_s: float = 15.0,
                 backoff_s: tuple[float, float] = (0.2, 5.0)) -> None:
        self.spool = spool
        self.config = config
        self.metrics = metrics
        self.batch = batch
        self.send_timeout_s = send_timeout_s
        self.backoff_s = backoff_s
        self.wakeup = asyncio.Event()
        self._producer: AIOKafkaProducer | None = None
        self._entered: dict[int, float] = {}
        # sent but never acknowledged, by this process or (from the journal) an earlier one
        self._uncertain: set[int] = set(spool.uncertain_at_open)
        metrics.spool_corrupt.inc(spool.corrupt_entries)
        self.reconciled = 0  # uncertain records found already written, not sent again

    def note_put(self, rec: Spooled) -> None:
        self._entered[rec.seq] = time.monotonic()
        self.wakeup.set()

    async def run(self, stop: asyncio.Event) -> None:
        delay = self.backoff_s[0]
        while not (stop.is_set() and not len(self.spool)):
            head = self.spool.head(self.batch)
            self._gauge()
            if not head:
                self.wakeup.clear()
                await _wait_any(self.wakeup, stop, timeout=1.0)
                continue
            if await self._publish(head):
                delay = self.backoff_s[0]
                continue
            if stop.is_set():
                break
            await _wait_any(stop, None, timeout=delay)
            delay = min(delay * 2, self.backoff_s[1])
        await self._close_producer()
        self._gauge()

    async def _publish(self, head: list[Spooled]) -> bool:
        try:
            if self._uncertain & {r.seq for r in head}:
                head = await self._reconcile(head)
                if not head:
                    return True
            producer = await self._ensure_producer()
            self.spool.sent([r.seq for r in head])  # uncertain from here, restarts included
            futures = [await producer.send(r.topic, value=r.value, key=r.key,
                                           timestamp_ms=r.timestamp_ms,
                                           headers=spooled_header(self._waited_ms(r)))
                       for r in head]
            done, _pending = await asyncio.wait(futures, timeout=self.send_timeout_s)
        except (KafkaError, OSError, TimeoutError) as exc:
            return await self._down(exc)
        acked = [r for r, f in zip(head, futures, strict=True)
                 if f in done and not f.cancelled() and f.exception() is None]
        self._settle(acked)
        if len(acked) < len(head):
            acked_seqs = {r.seq for r in acked}
            self._uncertain.update(r.seq for r in head if r.seq not in acked_seqs)
            return await self._down(RuntimeError(f"{len(head) - len(acked)} records unacked"))
        self.metrics.broker_up.set(1)
        return True

    async def _reconcile(self, head: list[Spooled]) -> list[Spooled]:
        """Settle the uncertain records already on their topic; return those still to send."""
        uncertain = [r for r in head if r.seq in self._uncertain]
        window = 2 * len(uncertain) + 1000
        present = await _tail_digests(self.config, sorted({r.topic for r in uncertain}), window,
                                      self.send_timeout_s)
        written = [r for r in uncertain if _digest(r.value) in present]
        self._settle(written)
        self.reconciled += len(written)
        self._uncertain.difference_update(r.seq for r in uncertain)
        done = {r.seq for r in written}
        if written:
            log.info("reconciled %d records already written before the outage", len(written))
        return [r for r in head if r.seq not in done]

    def _waited_ms(self, rec: Spooled) -> int:
        """How long the record has been in the spool: since ``note_put`` in this process, or,
        for one an earlier process spooled, since its event time (a little more than its
        wait: it outlived that process, so it is a backlog either way)."""
        entered = self._entered.get(rec.seq)
        if entered is not None:
            return int((time.monotonic() - entered) * 1000)
        return max(0, int(time.time() * 1000) - rec.timestamp_ms)

    def _settle(self, acked: list[Spooled]) -> None:
        now = time.monotonic()
        self.spool.done([r.seq for r in acked])
        for r in acked:
            self.metrics.published.labels(r.event_type).inc()
            entered = self._entered.pop(r.seq, None)
            if entered is not None:
                self.metrics.publish_latency.observe(now - entered)
        self._gauge()

    async def _down(self, exc: BaseException) -> bool:
        self.metrics.broker_up.set(0)
        log.warning("kafka unreachable, %d records spooled: %s", len(self.spool), exc)
        await self._close_producer()
        return False

    async def _ensure_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = AIOKafkaProducer(**self.config.client_kwargs(), **PRODUCER_SETTINGS,
                                        request_timeout_ms=int(self.send_timeout_s * 1000))
            try:
                await asyncio.wait_for(producer.start(), self.send_timeout_s)
            except BaseException:
                await _quiet_stop(producer)
                raise
            self._producer = producer
        return self._producer

    async def _close_producer(self) -> None:
        """Stop the producer and wait until it can deliver nothing more: aiokafka's ``stop``
        waits for the batches in flight, which retry until they expire (``request_timeout_ms``
        = ``send_timeout_s``). Cut short, its sender would go on retrying in the background and
        could write a batch after ``_reconcile`` read the topic, which then sends it again."""
        if self._producer is not None:
            producer, self._producer = self._producer, None
            await _quiet_stop(producer, self.send_timeout_s + 10)

    def _gauge(self) -> None:
        self.metrics.spool_depth.set(len(self.spool))
        self.metrics.spool_bytes.set(self.spool.live_bytes)


def _digest(value: bytes) -> bytes:
    return hashlib.blake2b(value, digest_size=16).digest()


async def _tail_digests(config: KafkaConfig, topics: list[str], window: int,
                        timeout_s: float) -> set[bytes]:
    """Digests of the last ``window`` records of every partition of ``topics``."""
    consumer = AIOKafkaConsumer(**config.client_kwargs(), group_id=None,
                                enable_auto_commit=False, isolation_level="read_uncommitted")
    try:  # stopped even when starting fails (the broker may still be away)
        await asyncio.wait_for(consumer.start(), timeout_s)
        parts = [TopicPartition(t, p) for t in topics
                 for p in await _partitions(config, t, timeout_s)]
        consumer.assign(parts)
        ends = await consumer.end_offsets(parts)
        starts = await consumer.beginning_offsets(parts)
        for tp in parts:
            consumer.seek(tp, max(starts[tp], ends[tp] - window))
        digests: set[bytes] = set()
        pending = {tp for tp in parts if ends[tp] > starts[tp]}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while pending and loop.time() < deadline:
            batches = await consumer.getmany(*pending, timeout_ms=500)
            for records in batches.values():
                digests.update(_digest(r.value) for r in records if r.value is not None)
            for tp in list(pending):
                if await consumer.position(tp) >= ends[tp]:
                    pending.discard(tp)
        if pending:
            raise TimeoutError(f"could not read the tail of {sorted(map(str, pending))}")
        return digests
    finally:
        await consumer.stop()


async def _partitions(config: KafkaConfig, topic: str, timeout_s: float) -> list[int]:
    admin = AIOKafkaAdminClient(**config.client_kwargs())
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        described = await admin.describe_topics([topic])
        return sorted(p["partition"] for d in described for p in d["partitions"])
    finally:
        await admin.close()


async def _quiet_stop(producer: AIOKafkaProducer, timeout_s: float = 5) -> None:
    try:
        await asyncio.wait_for(producer.stop(), timeout_s)
    except Exception as exc:
        log.debug("producer stop: %s", exc)


async def _wait_any(a: asyncio.Event, b: asyncio.Event | None, timeout: float) -> None:
    waits = [asyncio.ensure_future(a.wait())]
    if b is not None:
        waits.append(asyncio.ensure_future(b.wait()))
    _done, pending = await asyncio.wait(waits, timeout=timeout,
                                        return_when=asyncio.FIRST_COMPLETED)
    for p in pending:
        p.cancel()
