"""Assemble a node agent from options: which collectors, where the spool is, which readers.

The one place that knows every concrete collector; the agent loop itself only knows the
``Collector`` protocol.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainguard.agent.metrics import AgentMetrics
from trainguard.agent.node_agent import AgentIdentity, NodeAgent
from trainguard.agent.publisher import SpoolPublisher
from trainguard.agent.pump import SocketPump
from trainguard.agent.spool import DiskSpool
from trainguard.bus.config import KafkaConfig
from trainguard.collectors.base import Collector, Discrete, Reading
from trainguard.collectors.process import ProcessCollector
from trainguard.collectors.steps import StepReceiver
from trainguard.events.topics import TopicNames

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentOptions:
    node: str
    spool_dir: Path
    job_id: str | None = None
    interval_s: float = 1.0
    spool_max_bytes: int = 256 << 20
    socket_path: Path | None = None
    gpu: str = "auto"
    dcgm_url: str = "http://127.0.0.1:9400/metrics"
    interfaces: Sequence[str] | None = None
    peers: Sequence[str] = ()
    kernel_log: bool = True
    fault_log: Path | None = None
    discover: bool = False


@dataclass
class BuiltAgent:
    agent: NodeAgent
    metrics: AgentMetrics
    processes: ProcessCollector
    readers: list[tuple[int, Callable[[], Sequence[Discrete]]]] = field(default_factory=list)
    fast_polls: list[Callable[[int], Sequence[Discrete]]] = field(default_factory=list)
    closers: list[Callable[[], None]] = field(default_factory=list)

    async def run(self, stop: asyncio.Event) -> None:
        await self.agent.run(stop, self.readers, self.fast_polls)

    def close(self) -> None:
        for close in reversed(self.closers):
            try:
                close()
            except Exception:
                log.exception("closing a collector failed")


def build_agent(opts: AgentOptions, config: KafkaConfig) -> BuiltAgent:
    metrics = AgentMetrics()
    identity = AgentIdentity(opts.node, opts.job_id)
    spool = DiskSpool(opts.spool_dir, max_bytes=opts.spool_max_bytes)
    publisher = SpoolPublisher(spool, config, metrics)
    processes = ProcessCollector(opts.node)
    steps = StepReceiver(opts.node, opts.socket_path)
    pump = SocketPump(steps.fileno(), steps.drain_discrete)  # started once all is built
    intake = _registering(pump.take, processes)
    collectors: list[Collector] = [_Discovery(processes)] if opts.discover else []
    # the tick polls exits too (processes.collect): what the pump holds is taken first there
    collectors += [_Intake(intake), processes]
    # closers run in reverse: the pump stops before the socket
    closers: list[Callable[[], None]] = [spool.close, processes.close, steps.close, pump.stop]
    gpu = _gpu_collector(opts)
    if gpu is not None:
        collectors.append(gpu)
        close = getattr(gpu, "close", None)
        if callable(close):
            closers.append(close)
    from trainguard.collectors.net import NetCollector, PeerSpec

    net = NetCollector(opts.node, job_id=opts.job_id, interfaces=opts.interfaces,
                       peers=[PeerSpec(host) for host in opts.peers])
    collectors.append(net)
    closers.append(net.close)
    if opts.kernel_log:
        from trainguard.collectors.kernel_log import KernelLogFollower, open_kernel_log

        try:
            source = open_kernel_log()
        except OSError as exc:
            log.warning("no kernel log on this node: %s", exc)
        else:
            collectors.append(KernelLogFollower(source, node=opts.node, job_id=opts.job_id))
            closers.append(source.close)
    if opts.fault_log is not None:
        from trainguard.collectors.health_import import FaultLogFollower

        collectors.append(FaultLogFollower(opts.fault_log, job_id=opts.job_id))
    collectors.append(_StepSocketHealth(steps))
    agent = NodeAgent(identity, collectors, spool, publisher, TopicNames(config.topic_prefix),
                      metrics, interval_s=opts.interval_s,
                      job_of_node=_NodeJob(processes))
    pump.start()
    return BuiltAgent(agent, metrics, processes, closers=closers,
                      fast_polls=[intake, processes.poll_exits])


class _Intake:
    """The step socket's records the pump holds, taken at the tick (before its exit poll)."""

    name = "intake"

    def __init__(self, take: Callable[[int], Sequence[Discrete]]) -> None:
        self.take = take

    def collect(self, now_us: int) -> Reading:
        return Reading(discrete=list(self.take(now_us)))


class _StepSocketHealth:
    """Reports the step socket's malformed-datagram counts each interval; the datagrams
    themselves are drained by the pump thread, never here."""

    name = "steps"

    def __init__(self, receiver: StepReceiver) -> None:
        self.receiver = receiver

    def collect(self, now_us: int) -> Reading:
        return self.receiver.drain(max_datagrams=0)


class _Discovery:
    """Each interval, start watching new processes whose environment names a job."""

    name = "discovery"

    def __init__(self, processes: ProcessCollector) -> None:
        self.processes = processes

    def collect(self, now_us: int) -> Reading:
        self.processes.discover()
        return Reading()


def _registering(drain: Callable[[int], Sequence[Discrete]],
                 processes: ProcessCollector) -> Callable[[int], Sequence[Discrete]]:
    """Wrap the step socket's drain: a rank that reports is watched from its first report
    (its pid, job, rank and binding epoch come in every datagram), so its exit is seen; what a
    rank says before it leaves (a departure) goes with that exit. It runs before the exits are
    polled (in the same fast poll), and the rank says it before it ends."""
    from trainguard.events.payloads import Heartbeat, ProcessDeparture, StepReport

    known: dict[int, tuple[str, int, int]] = {}

    def drain_and_register(now_us: int) -> Sequence[Discrete]:
        items = drain(now_us)
        for item in items:
            p = item.payload
            if isinstance(p, StepReport | Heartbeat | ProcessDeparture) and p.pid is not None:
                ident = (item.job_id, p.rank, p.binding_epoch)
                if known.get(p.pid) != ident:
                    known[p.pid] = ident
                    processes.register(p.pid, item.job_id, p.rank, p.binding_epoch)
                if isinstance(p, ProcessDeparture):
                    processes.declare(p.pid, p)
        return items

    return drain_and_register


def _gpu_collector(opts: AgentOptions) -> Collector | None:
    """The GPU source asked for; ``auto`` takes NVML where it initialises, else none."""
    from trainguard.collectors.gpu import (
        DcgmExporterCollector,
        NvidiaSmiCollector,
        NvmlCollector,
        NvmlUnavailable,
    )

    if opts.gpu == "none":
        return None
    if opts.gpu == "dcgm":
        return DcgmExporterCollector(opts.dcgm_url)
    if opts.gpu == "smi":
        return NvidiaSmiCollector()
    nvml = NvmlCollector(node=opts.node, job_id=opts.job_id)
    try:
        nvml.open()
    except NvmlUnavailable as exc:
        if opts.gpu == "nvml":
            raise
        log.warning("no GPU telemetry on this node (NVML: %s)", exc)
        return None
    return nvml


class _NodeJob:
    """The job this node's records are filed under: the one job with ranks here. A node stays
    with its job after its ranks are gone (until another job's ranks appear), so the job's
    event time keeps moving and silence or exits are still decided when every rank died."""

    def __init__(self, processes: ProcessCollector) -> None:
        self.processes = processes
        self.last: str | None = None

    def __call__(self) -> str | None:
        jobs = self.processes.jobs()
        if len(jobs) == 1:
            self.last = jobs[0]
        elif jobs:
            return None
        return self.last
