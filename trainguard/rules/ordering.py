"""Event-time ordering: a watermark (max event time seen - allowed lateness) and a reorder
buffer that releases events in (event_time, event_id) order once the watermark passes them.

Whatever the arrival interleaving within the lateness bound, the released sequence is the
same, and so is everything computed from it. Duplicates (same event_id) still in the buffer
collapse; an event at or below the released watermark is late: counted and dropped (a
duplicate of an event already released is always in that case).

Lanes. Events may come from several inputs read side by side (the streams worker reads a job's
task and telemetry topics). Live, each input is in event-time order within the lateness bound,
but the inputs are not in step with each other: a worker that starts, or restarts, behind a
backlog reads its inputs in turns, record for record, so the sparse input (a node's telemetry,
two records a second) races seconds ahead of the dense one (every rank's steps). A watermark
taken from the maximum over all inputs would then drop the dense input's backlog as late. So
an event may name its ``lane``: the watermark is the minimum over the lanes of each lane's
maximum (less the lateness), counting only the lanes within ``idle_us`` of the newest event:
a lane further behind than that is idle (its source stopped: a finished job's step reports
while its node's telemetry goes on) and no longer holds the others back. ``idle_us`` is what a
catch-up may lag one input behind another without losing records, and the longest a stopped
lane delays the rest. A lane ``expect``-ed but not seen yet stands at the first event's time
for ``expect_us``: a worker's first reads of its inputs may come one before the other, and a
job with no such input at all is held that long at its start only. Lanes only ever hold the
watermark back, so the released sequence is the same as without them whenever neither drops
a record.

Backlog hold. A record may come with how long it waited in an agent's spool (``spooled_us``,
from the record's header, ``bus/headers.py``). Its arrival is its ``ingest_time`` (stamped by
the agent when it spooled it; the event time if unstamped) plus that wait: when it was sent,
on the clock of the host that sent it. A record that waited at least ``backlog_us`` is a
backlog: its agent was cut off from the broker and is draining what it kept. Agents cut off
together (the head partitioned from the nodes, the broker down) drain one after another, and
the first one through would move the event time a whole outage ahead: the others' records of
that time would be late and dropped, and their nodes found silent. So the watermark stands
still until the newest arrival is ``hold_us`` past the last backlog record's arrival: every
agent that drains within ``hold_us`` of the one before loses nothing; one that never drains
(its node died meanwhile) holds the others ``hold_us`` longer, then the watermark moves on
and its silence is decided. Arrivals compared come from different hosts' clocks, so
``hold_us`` must dwarf their skew. A backlog record already behind the watermark (one agent
cut off alone while the others went on: its records are late whatever happens) holds nothing.
The hold, too, only holds the watermark back.
"""

from __future__ import annotations

import heapq
from typing import Any

import orjson

from trainguard.events.codec import decode_obj, encode
from trainguard.events.envelope import Event


class ReorderBuffer:
    def __init__(self, allowed_lateness_us: int, idle_us: int = 0,
                 expect: tuple[str, ...] = (), expect_us: int = 0, *,
                 backlog_us: int = 0, hold_us: int = 0) -> None:
        self.lateness = allowed_lateness_us
        self.idle = idle_us
        self.expect = expect
        self.expect_us = expect_us
        self.backlog_us = backlog_us  # 0: no backlog hold
        self.hold_us = hold_us
        self.arrival = -1  # the newest arrival seen (see "Backlog hold")
        self.hold_until = -1  # the watermark stands still while arrival is below this
        self.first = -1  # the first event's time: where a lane expected but not seen stands
        self.max_time = -1
        self.lanes: dict[str, int] = {}  # lane -> the newest event time on it
        self.watermark = -1  # everything at or below has been released
        self.late = 0
        self.duplicates = 0
        self._heap: list[tuple[int, str, Event]] = []
        self._ids: set[str] = set()
        self._raw: dict[str, Any] = {}  # event_id -> wire JSON object, filled by snapshot()

    def push(self, event: Event, lane: str | None = None, spooled_us: int = 0) -> list[Event]:
        """Take one arriving event (read from input ``lane``, if named; ``spooled_us``: how
        long it waited in an agent's spool); return the events now released, in order."""
        t = event.event_time
        held = self._arrive(event, spooled_us, t > self.watermark) if self.backlog_us else False
        if t <= self.watermark:
            self.late += 1
            return self._advance() if held else []
        eid = event.event_id
        if eid in self._ids:
            self.duplicates += 1
            return self._advance() if held else []
        self._ids.add(eid)
        heapq.heappush(self._heap, (t, eid, event))
        moved = False
        if t > self.max_time:
            if self.first < 0:
                self.first = t
            self.max_time = t
            moved = True
        if lane is not None and t > self.lanes.get(lane, -1):
            self.lanes[lane] = t
            moved = True
        return self._advance() if moved or held else []

    def _advance(self) -> list[Event]:
        wm = self._mark()
        if self._heap and self._heap[0][0] <= wm:
            return self._release(wm)
        return []

    def _arrive(self, event: Event, spooled_us: int, ahead: bool) -> bool:
        """Note the event's arrival; True when it ends a backlog hold (the watermark may move
        though no event time did). A backlog record already behind the watermark (one node
        cut off alone while the others went on) is late whatever comes: it holds nothing."""
        base = event.ingest_time if event.ingest_time is not None else event.event_time
        at = base + max(0, spooled_us)
        was_held = self.arrival < self.hold_until
        if at > self.arrival:
            self.arrival = at
        if ahead and spooled_us >= self.backlog_us:
            self.hold_until = max(self.hold_until, at + self.hold_us)
        return was_held and self.arrival >= self.hold_until

    def _mark(self) -> int:
        """The watermark the events seen allow: the slowest lane not idle, less the lateness;
        where it stands during a backlog hold."""
        if self.arrival < self.hold_until:
            return self.watermark
        top = self.max_time
        cut = top - self.idle
        for newest in self.lanes.values():
            if cut <= newest < top:
                top = newest
        if self.first < top and self.max_time - self.expect_us <= self.first and any(
                name not in self.lanes for name in self.expect):
            top = self.first
        return top - self.lateness

    def accepts(self, event: Event) -> bool:
        """Would ``push`` keep it (neither late nor a duplicate still buffered)?"""
        return event.event_time > self.watermark and event.event_id not in self._ids

    def drain(self) -> list[Event]:
        """Release everything (end of a replay)."""
        return self._release(self.max_time)

    def _release(self, wm: int) -> list[Event]:
        out: list[Event] = []
        heap = self._heap
        while heap and heap[0][0] <= wm:
            _, eid, ev = heapq.heappop(heap)
            self._ids.discard(eid)
            if self._raw:
                self._raw.pop(eid, None)
            out.append(ev)
        if wm > self.watermark:
            self.watermark = wm
        return out

    def __len__(self) -> int:
        return len(self._heap)

    def ids(self) -> set[str]:
        """The ids of the events buffered now (a copy)."""
        return set(self._ids)

    def snapshot(self, *, events: bool = True) -> dict[str, Any]:
        """``events=False``: the buffered events' ids only (``"ids"``), for a store that keeps
        each event once under its own key instead of rewriting them all on every snapshot;
        put them back as ``"buffered"`` (wire JSON objects) before ``restore``."""
        doc: dict[str, Any] = {"max_time": self.max_time, "watermark": self.watermark,
                               "late": self.late, "duplicates": self.duplicates}
        if self.lanes or self.expect:
            doc["lanes"] = dict(sorted(self.lanes.items()))
            doc["first"] = self.first
        if self.backlog_us:
            doc["arrival"] = self.arrival
            doc["hold_until"] = self.hold_until
        if events:
            doc["buffered"] = [self._encoded(eid, ev) for _, eid, ev in self._heap]
        else:
            doc["ids"] = sorted(self._ids)
        return doc

    def _encoded(self, eid: str, ev: Event) -> Any:
        # a table write per event snapshots the buffer each time: encode each event once
        raw = self._raw.get(eid)
        if raw is None:
            raw = self._raw[eid] = orjson.loads(encode(ev))
        return raw

    def restore(self, doc: dict[str, Any]) -> None:
        self.max_time = int(doc["max_time"])
        self.watermark = int(doc["watermark"])
        self.late = int(doc["late"])
        self.duplicates = int(doc["duplicates"])
        self.lanes = {str(k): int(v) for k, v in doc.get("lanes", {}).items()}
        self.first = int(doc.get("first", self.max_time))
        self.arrival = int(doc.get("arrival", -1))
        self.hold_until = int(doc.get("hold_until", -1))
        events = [(decode_obj(raw), raw) for raw in doc["buffered"]]
        self._heap = [(ev.event_time, ev.event_id, ev) for ev, _ in events]
        heapq.heapify(self._heap)
        self._ids = {ev.event_id for ev, _ in events}
        self._raw = {ev.event_id: raw for ev, raw in events}
