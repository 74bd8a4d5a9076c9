"""Where the log comes from: the Kafka topics (read to their current end, no consumer group)
or an exported JSON-lines file; and writing such a file. I/O at the edge, nothing else."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from aiokafka import AIOKafkaConsumer
from aiokafka.errors import KafkaError

from trainguard.bus.config import KafkaConfig
from trainguard.events.codec import decode, encode
from trainguard.events.envelope import Event
from trainguard.events.errors import ContractError
from trainguard.events.topics import EVENT_ROLES, TopicNames, TopicRole
from trainguard.incidents.model import order_key

log = logging.getLogger(__name__)
LOG_ROLES = EVENT_ROLES


class LogFileError(ValueError):
    """An exported log file that cannot be read: names the file, the line and the field."""


class LogSourceError(RuntimeError):
    """The topics cannot be read (broker unreachable, reading never reached the end)."""


@dataclass
class LogRead:
    events: list[Event] = field(default_factory=list)
    invalid: int = 0  # records refused by the contract (the streams dead-lettered them)


def read_log_file(path: Path) -> list[Event]:
    events: list[Event] = []
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise LogFileError(f"--log {path}: {exc.strerror}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                events.append(decode(line))
            except ContractError as err:
                raise LogFileError(f"{path}:{lineno}: {err}") from None
    return events


def order(events: Iterable[Event]) -> list[Event]:
    """Deduplicated by event id, in (event_time, event_id) order."""
    return sorted({e.event_id: e for e in events}.values(), key=order_key)


def write_log(events: Iterable[Event], out: IO[bytes]) -> int:
    n = 0
    for ev in order(events):
        out.write(encode(ev) + b"\n")
        n += 1
    return n


async def read_topics(cfg: KafkaConfig, roles: Sequence[TopicRole] = LOG_ROLES, *,
                      limit_s: float = 60.0) -> LogRead:
    """Every record now on the topics (their end offsets when reading starts)."""
    names = TopicNames(cfg.topic_prefix)
    consumer = AIOKafkaConsumer(*[names.name(r) for r in roles], **cfg.client_kwargs(),
                                group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest", isolation_level="read_committed")
    try:
        await consumer.start()
    except KafkaError as exc:
        await consumer.stop()
        raise LogSourceError(f"Kafka at {cfg.bootstrap}: {exc} (is the broker up? or read an "
                             "exported file with --log)") from None
    got = LogRead()
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit_s
        while not consumer.assignment() and loop.time() < deadline:
            await consumer.getmany(timeout_ms=100)  # records before assignment cannot come
        parts = list(consumer.assignment())
        ends = await consumer.end_offsets(parts)
        while loop.time() < deadline:
            pending = [tp for tp in parts if await consumer.position(tp) < ends[tp]]
            if not pending:
                break
            batches = await consumer.getmany(*pending, timeout_ms=500)
            for tp in sorted(batches, key=lambda t: (t.topic, t.partition)):
                for rec in batches[tp]:
                    if rec.offset >= ends[tp]:
                        continue
                    try:
                        got.events.append(decode(rec.value))
                    except ContractError:
                        got.invalid += 1
        else:
            raise LogSourceError(f"reading the log did not reach the end within {limit_s:.0f} s")
    finally:
        await consumer.stop()
    if got.invalid:
        log.warning("skipped %d record(s) refused by the contract (see the dead-letter topic)",
                    got.invalid)
    return got
