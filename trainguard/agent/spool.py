"""A bounded on-disk queue between the collectors and Kafka.

Every record the agent publishes goes through the spool, so a broker outage changes nothing
for the collectors: records accumulate on disk and are flushed in order when Kafka returns.
The spool is a write-ahead journal (``journal.bin``) of three entry kinds: ``PUT`` (a record
with its priority, topic and key), ``SENT`` (records handed to the producer, not yet
acknowledged) and ``DONE`` (records acknowledged by the broker, or dropped). Opening a spool
replays the journal, so records survive an agent restart; the journal is rewritten without
settled records when it grows past twice its live size.

The journal trusts none of its own bytes. Each entry is framed as ``MAGIC kind length crc32
body``, the CRC (``zlib.crc32``, the stdlib's; CRC32C would need a dependency) covering kind,
length and body. Opening skips any entry whose frame or checksum does not hold, counts it in
``corrupt_entries``, and finds the next entry by its magic, so one bad byte or a torn write
costs at most the entry it hit. A journal with a skipped entry is rewritten clean at open.

*Uncertain* records are those sent but never acknowledged: the broker may hold them. They
survive a restart (``uncertain_at_open``: every live record with a ``SENT`` entry, or every
live record at all when an entry was lost, since a lost ``DONE`` or ``SENT`` cannot be told
apart, or when the journal had the first format, which did not record sends), and the
publisher checks the topic for them before sending them again.

A journal of the first format (no magic, no checksum) is read once and rewritten in this
format; there it can only stop at the first entry that does not parse.

Budget: when the live bytes exceed ``max_bytes``, records are dropped lowest priority first,
oldest first within a priority — plain telemetry goes before heartbeats, which go before step
reports, exits and everything else. Every drop is counted by event type.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path

log = logging.getLogger(__name__)

_PUT = 1
_DONE = 2
_SENT = 3
_KINDS = (_PUT, _DONE, _SENT)
MAGIC = b"\xf7TGj"  # never a first-format entry's first byte (its kinds are 1 and 2)
_FRAME = struct.Struct(">BII")  # kind, body length, crc32 of kind + length + body
_LEN = struct.Struct(">BI")
_V1_HEAD = struct.Struct(">BI")  # first format: kind, body length
_PUT_META = struct.Struct(">QBQHH")  # seq, priority, timestamp ms, topic length, key length
_SEQ = struct.Struct(">Q")
MAX_ENTRY = 1 << 30  # no entry is larger: a length beyond it is damage


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


@dataclass(frozen=True)
class Entry:
    kind: int
    body: bytes


class BadEntry(ValueError):
    """An entry whose checksum holds but whose body does not parse."""


def frame(kind: int, body: bytes) -> bytes:
    """One journal entry: magic, kind, length, CRC32 of kind + length + body, body."""
    crc = zlib.crc32(body, zlib.crc32(_LEN.pack(kind, len(body))))
    return MAGIC + _FRAME.pack(kind, len(body), crc) + body


def scan(data: bytes) -> tuple[list[Entry], int]:
    """Every intact entry of a journal in order, and how many damaged stretches were skipped.

    An entry is intact when its magic, kind, length and checksum hold; after anything else
    the scan resumes at the next magic, so damage costs only the entries it touched."""
    entries: list[Entry] = []
    skipped = 0
    pos = 0
    head = len(MAGIC) + _FRAME.size
    in_damage = False
    while pos < len(data):
        entry, end = _entry_at(data, pos, head)
        if entry is not None:
            entries.append(entry)
            pos = end
            in_damage = False
            continue
        if not in_damage:
            skipped += 1
            in_damage = True
        nxt = data.find(MAGIC, pos + 1)
        if nxt < 0:
            break
        pos = nxt
    return entries, skipped


def _entry_at(data: bytes, pos: int, head: int) -> tuple[Entry | None, int]:
    if data[pos: pos + len(MAGIC)] != MAGIC or pos + head > len(data):
        return None, pos
    kind, length, crc = _FRAME.unpack_from(data, pos + len(MAGIC))
    end = pos + head + length
    if kind not in _KINDS or length > MAX_ENTRY or end > len(data):
        return None, pos
    body = data[pos + head: end]
    if zlib.crc32(body, zlib.crc32(_LEN.pack(kind, length))) != crc:
        return None, pos
    return Entry(kind, body), end


def scan_v1(data: bytes) -> tuple[list[Entry], int]:
    """Entries of a first-format journal (no checksum): up to the first one that is torn."""
    entries: list[Entry] = []
    pos = 0
    while pos + _V1_HEAD.size <= len(data):
        kind, length = _V1_HEAD.unpack_from(data, pos)
        body = data[pos + _V1_HEAD.size: pos + _V1_HEAD.size + length]
        if len(body) < length or kind not in (_PUT, _DONE):
            break
        entries.append(Entry(kind, body))
        pos += _V1_HEAD.size + length
    return entries, int(pos < len(data))


def put_body(rec: Spooled) -> bytes:
    topic = rec.topic.encode()
    type_ = rec.event_type.encode()
    return (_PUT_META.pack(rec.seq, rec.priority, rec.timestamp_ms, len(topic), len(rec.key))
            + topic + rec.key + bytes([len(type_)]) + type_ + rec.value)


def parse_put(body: bytes) -> Spooled:
    """The record of a ``PUT`` body; ``BadEntry`` when it does not parse."""
    try:
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
        if len(topic) != tlen or len(key) != klen or len(event_type) != ylen:
            raise BadEntry("short put")
        return Spooled(seq, Priority(prio), topic, key, body[pos:], event_type, ts_ms)
    except (struct.error, IndexError, UnicodeDecodeError, ValueError) as exc:
        raise BadEntry(str(exc)) from exc


def seqs_body(seqs: Iterable[int]) -> bytes:
    return b"".join(_SEQ.pack(s) for s in seqs)


def parse_seqs(body: bytes) -> Iterator[int]:
    if len(body) % _SEQ.size:
        raise BadEntry(f"a list of sequence numbers of {len(body)} bytes")
    for (seq,) in _SEQ.iter_unpack(body):
        yield seq


@dataclass
class Recovered:
    """What a journal's bytes say: the live records in order and which of them were sent."""

    live: OrderedDict[int, Spooled] = field(default_factory=OrderedDict)
    sent: set[int] = field(default_factory=set)
    next_seq: int = 0
    corrupt_entries: int = 0
    migrated: bool = False

    def apply(self, entry: Entry) -> None:
        if entry.kind == _PUT:
            rec = parse_put(entry.body)
            self.live.pop(rec.seq, None)
            self.live[rec.seq] = rec
            self.next_seq = max(self.next_seq, rec.seq + 1)
        elif entry.kind == _SENT:
            self.sent.update(s for s in parse_seqs(entry.body) if s in self.live)
        else:
            for seq in parse_seqs(entry.body):
                self.live.pop(seq, None)
                self.sent.discard(seq)

    @property
    def uncertain(self) -> frozenset[int]:
        """Live records that may already be on the topic: those sent, or all of them when an
        entry was lost (a lost ``SENT`` or ``DONE`` cannot be told) or the journal had the
        first format (which did not record sends)."""
        return frozenset(self.live if self.corrupt_entries or self.migrated else self.sent)


def recover(data: bytes) -> Recovered:
    """Replay a journal's bytes, whatever they are: damage is skipped and counted, never raised."""
    got = Recovered()
    if not data:
        return got
    entries, got.corrupt_entries = scan(data)
    if not entries and data[:1] in (bytes([_PUT]), bytes([_DONE])):
        entries, got.corrupt_entries = scan_v1(data)
        got.migrated = True
    for entry in entries:
        try:
            got.apply(entry)
        except BadEntry:
            got.corrupt_entries += 1
    return got


class DiskSpool:
    def __init__(self, directory: Path, max_bytes: int = 256 << 20, fsync: bool = False) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.dropped: Counter[str] = Counter()
        self.corrupt_entries = 0  # damaged stretches skipped when the journal was opened
        self.migrated = False  # a first-format journal was rewritten in this format
        self._live: OrderedDict[int, Spooled] = OrderedDict()
        self._sent: set[int] = set()
        self._bytes = 0
        self._next_seq = 0
        self._journal_bytes = 0
        directory.mkdir(parents=True, exist_ok=True)
        self._path = directory / "journal.bin"
        self.uncertain_at_open: frozenset[int] = frozenset()
        rewrite = self._recover()
        self._sent |= self.uncertain_at_open
        self._fh = open(self._path, "ab")  # noqa: SIM115 - held for the spool's life
        if rewrite:
            self._compact()

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
        self._append(frame(_PUT, put_body(rec)))
        self._live[rec.seq] = rec
        self._bytes += rec.size
        self._enforce_budget(rec.seq)
        return rec

    def sent(self, seqs: list[int]) -> None:
        """Records about to be handed to the producer: uncertain until ``done``, restarts too."""
        fresh = [s for s in seqs if s in self._live and s not in self._sent]
        if fresh:
            self._sent.update(fresh)
            self._append(frame(_SENT, seqs_body(fresh)))

    def done(self, seqs: list[int]) -> None:
        """Records acknowledged by the broker: settle them for good."""
        settled = [s for s in seqs if s in self._live]
        for s in settled:
            self._bytes -= self._live.pop(s).size
            self._sent.discard(s)
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
                    self._sent.discard(rec.seq)
            if self._bytes <= self.max_bytes:
                break
        self._write_done(victims)

    def _write_done(self, seqs: list[int]) -> None:
        if seqs:
            self._append(frame(_DONE, seqs_body(seqs)))

    def _append(self, data: bytes) -> None:
        self._fh.write(data)
        self._fh.flush()
        if self.fsync:
            os.fsync(self._fh.fileno())
        self._journal_bytes += len(data)

    def _recover(self) -> bool:
        """Replay the journal; True when it must be rewritten (damage, torn tail, old format)."""
        if not self._path.exists():
            return False
        data = self._path.read_bytes()
        got = recover(data)
        self._live, self._sent, self._next_seq = got.live, got.sent, got.next_seq
        self._bytes = sum(r.size for r in got.live.values())
        self.corrupt_entries, self.migrated = got.corrupt_entries, got.migrated
        self.uncertain_at_open = got.uncertain
        if got.corrupt_entries:
            log.warning("spool %s: skipped %d damaged journal entries; %d records kept",
                        self._path, got.corrupt_entries, len(got.live))
        if got.migrated:
            log.info("spool %s: first-format journal rewritten with checksums", self._path)
        self._journal_bytes = len(data)
        return bool(got.corrupt_entries) or got.migrated

    def _compact(self) -> None:
        tmp = self._path.with_suffix(".tmp")
        self._fh.close()
        with open(tmp, "wb") as fh:
            self._fh = fh
            self._journal_bytes = 0
            for rec in self._live.values():
                self._append(frame(_PUT, put_body(rec)))
            sent = [s for s in self._live if s in self._sent]
            if sent:
                self._append(frame(_SENT, seqs_body(sent)))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._path)
        self._fh = open(self._path, "ab")  # noqa: SIM115
