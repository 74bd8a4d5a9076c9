"""A bounded on-disk queue between the collectors and Kafka.

Every record the agent publishes goes through the spool, so a broker outage changes nothing
for the collectors: records accumulate on disk and are flushed in order when Kafka returns.
The spool is a write-ahead journal (``journal.bin``) of two entry kinds: ``PUT`` (a record with
its priority, topic and key) and ``DONE`` (records acknowledged by the broker, or dropped).
Opening a spool replays the journal, so records survive an agent restart; the journal is
rewritten without settled records when it grows past twice its live size.

Budget: when the live bytes exceed ``max_bytes``, records are dropped lowest priority first,
oldest first within a priority — plain telemetry goes before heartbeats, which go before step
reports, exits and everything else. Every drop is counted by event type.
"""

from __future__ import annotations

import os
import struct
from collections import Counter, OrderedDict
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

_PUT = 1
_DONE = 2
_HEAD = struct.Struct(">BI")  # kind, body length
_PUT_META = struct.Struct(">QBQHH")  # seq, priority, timestamp ms, topic length, key length
_DONE_BODY = struct.Struct(">Q")


class Priority(IntEnum):
    TELEMETRY = 0  # superseded by the next interval's sample
    HEARTBEAT = 1  # superseded by the next heartbeat or step report
    ESSENTIAL = 2  # step reports, exits, health, checkpoints: never dropped within budget


def priority_of(event_type: str) -> Priority:
    if event_type == "telemetry.node":
        return Priority.TELEMETRY
    if event_type == "heartbeat":
        return Priority.HEARTBEAT
    return Priority.ESSENTIAL


@dataclass(frozen=True)
class Spooled:
    seq: int
    priority: Priority
    topic: str
    key: bytes
    value: bytes
    event_type: str
    timestamp_ms: int

    @property
    def size(self) -> int:
        return len(self.value) + len(self.key) + len(self.topic)


class DiskSpool:
    def __init__(self, directory: Path, max_bytes: int = 256 << 20, fsync: bool = False) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.dropped: Counter[str] = Counter()
        self._live: OrderedDict[int, Spooled] = OrderedDict()
        self._bytes = 0
        self._next_seq = 0
        self._journal_bytes = 0
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / "journal.bin"
        self._recover()
        self._fh = open(self._path, "ab")  # noqa: SIM115 - held for the spool's life

    # -- queries ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._live)

    @property
    def live_bytes(self) -> int:
        return self._bytes

    def head(self, limit: int) -> list[Spooled]:
        """The oldest ``limit`` records not yet acknowledged, in order."""
        out = []
        for rec in self._live.values():
            out.append(rec)
            if len(out) >= limit:
                break
        return out

    # -- changes ------------------------------------------------------------------------

    def put(self, topic: str, key: bytes, value: bytes, event_type: str,
            timestamp_ms: int) -> Spooled:
        rec = Spooled(self._next_seq, priority_of(event_type), topic, key, value, event_type,
                      timestamp_ms)
        self._next_seq += 1
        self._write_put(rec)
        self._live[rec.seq] = rec
        self._bytes += rec.size
        self._enforce_budget(rec.seq)
        return rec

    def done(self, seqs: list[int]) -> None:
        """Records acknowledged by the broker: settle them for good."""
        settled = [s for s in seqs if s in self._live]
        for s in settled:
            self._bytes -= self._live.pop(s).size
        self._write_done(settled)
        if self._journal_bytes > 2 * max(self._bytes, 1 << 20):
            self._compact()

    def close(self) -> None:
        self._fh.close()

    # -- internals ----------------------------------------------------------------------

    def _enforce_budget(self, newest: int) -> None:
        if self._bytes <= self.max_bytes:
            return
        victims: list[int] = []
        for prio in Priority:
            for rec in list(self._live.values()):
                if self._bytes <= self.max_bytes:
                    break
                if rec.priority == prio and (rec.seq != newest or prio < Priority.ESSENTIAL):
                    victims.append(rec.seq)
                    self._bytes -= rec.size
                    self.dropped[rec.event_type] += 1
                    del self._live[rec.seq]
            if self._bytes <= self.max_bytes:
                break
        self._write_done(victims)

    def _write_put(self, rec: Spooled) -> None:
        topic = rec.topic.encode()
        type_ = rec.event_type.encode()
        body = (_PUT_META.pack(rec.seq, rec.priority, rec.timestamp_ms, len(topic), len(rec.key))
                + topic + rec.key + bytes([len(type_)]) + type_ + rec.value)
        self._append(_HEAD.pack(_PUT, len(body)) + body)

    def _write_done(self, seqs: list[int]) -> None:
        if not seqs:
            return
        body = b"".join(_DONE_BODY.pack(s) for s in seqs)
        self._append(_HEAD.pack(_DONE, len(body)) + body)

    def _append(self, data: bytes) -> None:
        self._fh.write(data)
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())
        self._journal_bytes += len(data)

    def _recover(self) -> None:
        if not self._path.exists():
            return
        data = self._path.read_bytes()
        pos = 0
        good_end = 0
        while pos + _HEAD.size <= len(data):
            kind, length = _HEAD.unpack_from(data, pos)
            body = data[pos + _HEAD.size: pos + _HEAD.size + length]
            if len(body) < length or kind not in (_PUT, _DONE):
                break  # a torn last write: everything before it is intact
            pos += _HEAD.size + length
            good_end = pos
            if kind == _PUT:
                rec = _parse_put(body)
                self._live[rec.seq] = rec
                self._bytes += rec.size
                self._next_seq = max(self._next_seq, rec.seq + 1)
            else:
                for (seq,) in _DONE_BODY.iter_unpack(body):
                    gone = self._live.pop(seq, None)
                    if gone is not None:
                        self._bytes -= gone.size
        if good_end < len(data):
            with open(self._path, "r+b") as fh:
                fh.truncate(good_end)
        self._journal_bytes = good_end

    def _compact(self) -> None:
        tmp = self._path.with_suffix(".tmp")
        self._fh.close()
        with open(tmp, "wb") as fh:
            self._fh = fh
            self._journal_bytes = 0
            for rec in self._live.values():
                self._write_put(rec)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._path)
        self._fh = open(self._path, "ab")  # noqa: SIM115


def _parse_put(body: bytes) -> Spooled:
    seq, prio, ts_ms, tlen, klen = _PUT_META.unpack_from(body, 0)
    pos = _PUT_META.size
    topic = body[pos: pos + tlen].decode()
    pos += tlen
    key = body[pos: pos + klen]
    pos += klen
    ylen = body[pos]
    pos += 1
    event_type = body[pos: pos + ylen].decode()
    pos += ylen
    return Spooled(seq, Priority(prio), topic, key, body[pos:], event_type, ts_ms)
