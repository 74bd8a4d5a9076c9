"""What every collector gives the node agent, and the one method it must have.

A collector reads one kind of source (NVML, a dcgm-exporter scrape, /sys/class/net, psutil,
the kernel log...) and returns a ``Reading``: samples that go into the node's one telemetry
record for this interval, plus discrete events (an XID line, a process exit) that are published
on their own at once. A collector never raises into the agent for bad input: it counts it in
``malformed`` (by kind) and carries on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from trainguard.events.envelope import Subject
from trainguard.events.payloads import (
    GpuSample,
    NicSample,
    Payload,
    PeerPath,
    ProcessSample,
)


@dataclass(frozen=True)
class Discrete:
    """An event to publish on its own, outside the interval's telemetry batch."""

    payload: Payload
    job_id: str
    event_time: int
    subject: Subject = field(default_factory=Subject)


@dataclass
class Reading:
    gpus: list[GpuSample] = field(default_factory=list)
    nics: list[NicSample] = field(default_factory=list)
    paths: list[PeerPath] = field(default_factory=list)
    processes: list[ProcessSample] = field(default_factory=list)
    tcp_retransmits: int | None = None
    discrete: list[Discrete] = field(default_factory=list)
    malformed: dict[str, int] = field(default_factory=dict)

    def merge(self, other: Reading) -> None:
        self.gpus.extend(other.gpus)
        self.nics.extend(other.nics)
        self.paths.extend(other.paths)
        self.processes.extend(other.processes)
        if other.tcp_retransmits is not None:
            self.tcp_retransmits = (self.tcp_retransmits or 0) + other.tcp_retransmits
        self.discrete.extend(other.discrete)
        for kind, n in other.malformed.items():
            self.malformed[kind] = self.malformed.get(kind, 0) + n


class Collector(Protocol):
    """One method: read the source now. ``now_us`` is the interval's event time."""

    name: str

    def collect(self, now_us: int) -> Reading: ...
