"""Reading the event log during and after a drill: a background follower for the live view
(stop conditions, progress) and a full read of one job's recorded events for the evidence."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import EventConsumer
from trainguard.bus.producer import EventProducer
from trainguard.events.codec import decode, encode
from trainguard.events.envelope import Event
from trainguard.events.topics import EVENT_ROLES, TopicRole

# A job's timeline: everything but node telemetry (keyed by node, never by job) and dead letters.
ROLES = [r for r in EVENT_ROLES if r is not TopicRole.TELEMETRY]  # the log, each event once


class LogTail(threading.Thread):
    """Follows every topic of the prefix from the start, keeping ``job_id``'s events. Rides
    through broker outages (the client reconnects)."""

    def __init__(self, cfg: KafkaConfig, job_id: str) -> None:
        super().__init__(daemon=True, name=f"logtail-{job_id}")
        self.cfg, self.job_id = cfg, job_id
        self._events: list[Event] = []
        self._lock = threading.Lock()
        self._news = threading.Condition(self._lock)
        self._halt = threading.Event()
        self.error: str | None = None

    def run(self) -> None:
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
        try:
            asyncio.run(self._follow())
        except Exception as exc:  # reported by the runner, never raised into it
            self.error = f"{type(exc).__name__}: {exc}"

    async def _follow(self) -> None:
        consumer = EventConsumer(self.cfg, ROLES, group_id=None, name="drill-tail", dlq=None)
        await consumer.start()
        try:
            while not self._halt.is_set():
                try:
                    batch = await consumer.poll(timeout_ms=300)
                except Exception:
                    await asyncio.sleep(0.5)  # the broker is away: try again
                    continue
                self.add([d.event for d in batch if d.event.job_id == self.job_id])
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), 10)

    def add(self, events: list[Event]) -> None:
        """Keep ``events`` (the follower's, or a test's) and wake whoever waits for news."""
        if events:
            with self._news:
                self._events.extend(events)
                self._news.notify_all()

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def wait_for_news(self, seen: int, timeout_s: float) -> int:
        """Block until more than ``seen`` events are kept, the tail stops, or ``timeout_s``
        passed; the count kept now."""
        with self._news:
            self._news.wait_for(lambda: len(self._events) > seen or self._halt.is_set(),
                                timeout_s)
            return len(self._events)

    def wait_until(self, done: Callable[[list[Event]], bool], limit_s: float) -> bool:
        """Block until ``done`` holds for the events kept (checked again at each arrival, and
        at least every second), or ``limit_s`` passed; whether it held."""
        deadline = time.monotonic() + limit_s
        seen = 0
        while not done(self.events()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            seen = self.wait_for_news(seen, min(1.0, left))
        return True

    def stop(self) -> None:
        self._halt.set()
        with self._news:
            self._news.notify_all()
        self.join(timeout=20)


async def _read(cfg: KafkaConfig, job_id: str, limit_s: float) -> list[Event]:
    consumer = EventConsumer(cfg, ROLES, group_id=None, name="drill-record", dlq=None)
    await consumer.start()
    try:
        got = await consumer.drain(idle_ms=1500, limit_s=limit_s)
    finally:
        await consumer.stop()
    return sorted((d.event for d in got if d.event.job_id == job_id),
                  key=lambda e: (e.event_time, e.event_id))


def read_job_log(cfg: KafkaConfig, job_id: str, limit_s: float = 90.0) -> list[Event]:
    """Every event of ``job_id`` on the log, in event-time order."""
    return asyncio.run(asyncio.wait_for(_read(cfg, job_id, limit_s), limit_s + 30))


def publish(cfg: KafkaConfig, events: Sequence[Event], timeout_s: float = 10.0) -> bool:
    """Send and wait for the acks; False (nothing raised) when the broker is away."""
    async def send() -> None:
        producer = EventProducer(cfg, request_timeout_ms=int(timeout_s * 1000))
        await producer.start()
        try:
            for e in events:
                await producer.send(e)
        finally:
            await producer.stop()

    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        asyncio.run(asyncio.wait_for(send(), timeout_s))
    except Exception:
        return False
    return True


def write_jsonl(path: Path, events: Sequence[Event]) -> None:
    with open(path, "wb") as fh:
        for e in events:
            fh.write(encode(e) + b"\n")


def read_jsonl(path: Path) -> list[Event]:
    """A recorded log, every line validated against the contract (a bad line raises)."""
    out = []
    with open(path, "rb") as fh:
        for line in fh:
            if line.strip():
                out.append(decode(line))
    return out
