"""What a service needs from the bus, as a Protocol: the real one is Kafka (``KafkaBus``: the
existing ``EventProducer`` / ``EventConsumer``), the twin for unit tests is in memory
(``bus/memory.py``). One contract suite (``tests/bus_contract.py``) runs against both.

The semantics both keep:
- ``EventSink.send(event)`` appends the event to its registry topic (``BY_NAME[type].topic``;
  an urgent type also to the urgent topic, ``BY_NAME[type].topics``)
  keyed by ``partition_key`` (the job): one job's events keep their order on one partition;
  ``ingest_time`` is stamped once. ``send_raw`` writes bytes as they are (dead letters).
- ``EventSource`` reads roles from a position: with a consumer group, from the group's committed
  offsets (else ``from_offset``), and ``commit()`` records what was polled; without a group,
  from ``from_offset`` ('earliest' or 'latest') every time. ``start_at`` overrides both for
  the partitions it names (a service resuming from a snapshot that covers the log up to
  there); ``positions()`` is where reading goes on in each partition (what ``commit()``
  records). A record that is not a valid event
  never reaches the caller: it goes to the dead-letter topic (through ``dlq``) with its reason
  and reading carries on.
- ``read(roles)``: every valid event now on the topics (no group, nothing committed).
- ``raw_source(roles, ...)``: the records as they are (bytes, tombstones, dead letters: nothing
  decoded, nothing dead-lettered), for a reader that judges them itself (the metrics service
  counts invalid records; their own consumers dead-letter them). Group positions as above;
  ``lag()`` is how far the reader is behind the end of each topic.
- ``lease(role, group_id=..., name=...)``: membership of a consumer group on one topic,
  which holds no records, only partitions: each partition is held by exactly one live member
  (Kafka's group assignment), a member that stops hands its partitions to the others at once,
  and one that stops answering loses them after the group's session timeout. A service runs
  as several instances, each active for the keys of the partitions it holds (``holds(key)``:
  the key's partition, as the producer places it) and standing by for the rest.
- Kafka only (``GroupLagSource``, optional): other consumer groups' committed positions from the
  admin API; a service checks ``isinstance(source, GroupLagSource)`` and goes without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from trainguard.bus.consumer import Check, ConsumerStats, Delivered
from trainguard.events.envelope import Event
from trainguard.events.topics import TopicNames, TopicRole


class EventSink(Protocol):
    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def send(self, event: Event) -> Any:
        """Append the event to its topic and wait until it is acknowledged."""
        ...

    async def enqueue(self, event: Event) -> Any:
        """Hand the event over; the returned awaitable resolves when it is acknowledged."""
        ...

    async def send_raw(self, topic: str, value: bytes, key: bytes | None = None) -> Any:
        """Bytes as they are (the dead-letter topic; tests of bad input)."""
        ...


class EventSource(Protocol):
    name: str
    stats: ConsumerStats

    uncommitted: bool  # records read (delivered or refused) since the last commit

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def poll(self, timeout_ms: int = 1000,
                   max_records: int | None = None) -> list[Delivered]:
        """The next valid events (in partition order), waiting up to ``timeout_ms``."""
        ...

    async def refuse(self, item: Delivered, exc: BaseException) -> Any:
        """Dead-letter a delivered record whose handling raised ``exc``; the caller commits
        past it and carries on."""
        ...

    async def commit(self) -> None:
        """Record the group's position: what was polled is not delivered to it again."""
        ...

    async def drain(self, *, idle_ms: int = 1500, limit_s: float = 30.0) -> list[Delivered]:
        """Everything up to the end of the topics now."""
        ...

    async def caught_up(self) -> bool:
        """Whether this consumer's position is the end of every partition it reads now
        (after ``drain``: False means it ran out of time, and what it read is partial)."""
        ...

    async def positions(self) -> dict[tuple[str, int], int]:
        """(topic, partition) -> the offset reading goes on from, for every partition this
        consumer reads now (after ``commit()``: what was committed)."""
        ...


@dataclass(frozen=True)
class RawRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None  # None: a tombstone


class RecordSource(Protocol):
    """Records as they are, in partition order (``Bus.raw_source``)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    async def poll(self, timeout_ms: int = 1000,
                   max_records: int | None = None) -> list[RawRecord]: ...

    async def commit(self) -> None:
        """Record the group's position (what was polled)."""
        ...

    async def lag(self) -> dict[str, int]:
        """Topic -> records between this reader's position and the end now (topics it has
        positions on)."""
        ...


class Lease(Protocol):
    """This member's share of a topic's partitions in a consumer group (``Bus.lease``)."""

    async def start(self) -> None: ...

    async def stop(self) -> None:
        """Leave the group: the other members take these partitions over now."""
        ...

    def held(self) -> frozenset[int]:
        """The partitions this member holds now (empty while the group rebalances)."""
        ...

    def holds(self, key: bytes) -> bool:
        """Whether this member holds the partition a record with ``key`` goes to."""
        ...

    def partition(self, key: bytes) -> int | None:
        """The partition a record with ``key`` goes to (None while the topic's partition count
        is unknown: before the member first held partitions)."""
        ...


@runtime_checkable
class GroupLagSource(Protocol):
    """Optional (Kafka only): other groups' committed positions, from the admin API."""

    async def group_lags(self, groups: Sequence[str]) -> dict[tuple[str, str], int]:
        """(group, topic role) -> records behind, for every role the group committed on."""
        ...


class Bus(Protocol):
    names: TopicNames

    def producer(self) -> EventSink: ...

    def consumer(self, roles: Sequence[TopicRole], *, group_id: str | None, name: str,
                 dlq: EventSink | None, from_offset: str = "earliest",
                 dedupe: bool = False, check: Check | None = None,
                 start_at: Mapping[tuple[str, int], int] | None = None) -> EventSource:
        """``dedupe``: a record whose event id was delivered already is dropped (consumers
        that fold state; bounded memory, see bus/consumer.py). ``check``: why a decoded event
        must not be believed (a signature that does not verify), or None; such a record is
        dead-lettered like a bad one. ``start_at``: (topic, partition) -> the offset to start
        that partition at, instead of the group's committed one or ``from_offset`` (others
        start as usual); applied once, when the partition is first assigned."""
        ...

    async def read(self, roles: Sequence[TopicRole]) -> list[Event]:
        """Every valid event now on the topics of ``roles`` (refused records are skipped)."""
        ...

    def raw_source(self, roles: Sequence[TopicRole], *, group_id: str | None, name: str,
                   from_offset: str = "earliest") -> RecordSource:
        """The raw records of ``roles`` (see the module's text)."""
        ...

    def lease(self, role: TopicRole, *, group_id: str, name: str) -> Lease:
        """Membership of ``group_id`` on the topic of ``role`` (see the module's text)."""
        ...

    def fenced_producer(self, fence_id: str) -> EventSink:
        """A producer that publishes each event atomically under ``fence_id`` (on Kafka, a
        transactional id). Starting one fences every producer started before it with the same
        id: their sends raise ``bus.errors.Fenced`` from then on. The lease's new holder
        starts one per partition it gained, so the old holder, if it still runs (paused, cut
        off from the group), can no longer publish for those partitions."""
        ...
