"""How one job's engine state is laid out in the streams app's table.

- ``<job>``: the engine snapshot without the events waiting in its reorder buffer (their ids
  only), plus ``"store"``: the chunk numbers still live. Rewritten once per consumed batch.
- ``<job>\\0ch\\0<n>``: chunk n, the records (their original bytes, as one JSON array) that
  entered the buffer during one batch. Written once; deleted when none of them is buffered.

So a batch costs one snapshot of the rules' state, one chunk of the records it buffered, and
the deletion of the chunks it emptied, instead of re-serialising every buffered event (the
lateness bound times the event rate) on every batch. Keys of a job share the prefix up to the
first NUL, which the app's partitioner hashes, so they live on the job's partition.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any

import orjson

from trainguard.streams.engine import JobEngine

CHUNK = b"\0ch\0"
CHUNK_BYTES = 256 << 10  # a chunk stays well under Kafka's 1 MB message limit


def chunk_key(job: bytes, n: int) -> bytes:
    return job + CHUNK + str(n).encode()


class JobStore:
    """The table entries of one job; ``table`` is the faust table (or any mapping)."""

    def __init__(self, table: MutableMapping[bytes, bytes], job: str) -> None:
        self.table = table
        self.key = job.encode()
        self.chunks: dict[int, set[str]] = {}  # live chunk -> ids of its events still buffered
        self.next = 0

    def load(self) -> dict[str, Any] | None:
        """The saved snapshot, buffered events put back, ready for the engine factory."""
        saved = self.table.get(self.key)
        if not saved:
            return None
        doc: dict[str, Any] = orjson.loads(saved)
        store = doc.pop("store", {"next": 0, "live": []})
        self.next = int(store["next"])
        buf = doc["buffer"]
        if "ids" not in buf:  # a snapshot with its events inline
            return doc
        wanted = set(buf.pop("ids"))
        events: dict[str, Any] = {}
        self.chunks = {}
        for n in store["live"]:
            mine = self.chunks[int(n)] = set()
            for raw in orjson.loads(self.table[chunk_key(self.key, int(n))]):
                eid = raw["event_id"]
                if eid in wanted:
                    events[eid] = raw
                    mine.add(eid)
        buf["buffered"] = [events[eid] for eid in sorted(wanted)]
        return doc

    def save(self, engine: JobEngine, before: set[str], raw: Mapping[str, bytes]) -> None:
        """After a batch: ``before`` = the buffered ids when the batch began; ``raw`` = the
        record bytes of the batch's events by id."""
        now = engine.buffered_ids()
        added = now - before
        part: list[str] = []
        size = 0
        for eid in sorted(added):
            part.append(eid)
            size += len(raw[eid]) + 1
            if size >= CHUNK_BYTES:
                self._chunk(part, raw)
                part, size = [], 0
        if part:
            self._chunk(part, raw)
        gone = before - now
        if gone:
            for n in [n for n, ids in self.chunks.items() if ids & gone]:
                ids = self.chunks[n]
                ids -= gone
                if not ids:
                    del self.chunks[n]
                    del self.table[chunk_key(self.key, n)]
        doc = engine.snapshot(events=False)
        doc["store"] = {"next": self.next, "live": sorted(self.chunks)}
        self.table[self.key] = orjson.dumps(doc)

    def _chunk(self, ids: list[str], raw: Mapping[str, bytes]) -> None:
        n = self.next
        self.next += 1
        self.table[chunk_key(self.key, n)] = b"[" + b",".join(raw[eid] for eid in ids) + b"]"
        self.chunks[n] = set(ids)


class Recorded(MutableMapping[bytes, bytes]):
    """A table's local store whose writes are also recorded (``pending``: key, value or None
    for a delete), so the caller sends them to the changelog itself, awaited, inside the
    current transaction - before the batch's offsets can be committed."""

    def __init__(self, store: MutableMapping[bytes, bytes]) -> None:
        self.store = store
        self.pending: list[tuple[bytes, bytes | None]] = []

    def __getitem__(self, key: bytes) -> bytes:
        return self.store[key]

    def __setitem__(self, key: bytes, value: bytes) -> None:
        self.store[key] = value
        self.pending.append((key, value))

    def __delitem__(self, key: bytes) -> None:
        del self.store[key]
        self.pending.append((key, None))

    def __iter__(self) -> Iterator[bytes]:
        return iter(self.store)

    def __len__(self) -> int:
        return len(self.store)

    def take(self) -> list[tuple[bytes, bytes | None]]:
        out, self.pending = self.pending, []
        return out
