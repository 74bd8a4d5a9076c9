"""Failure by silence or by exit.

``LivenessRule``: a rank is silent when no step report or heartbeat of it arrived for
``max(k_step_times x the job's median step interval, floor_ms)``. Silence is measured in event
time against the other events of the job (the engine releases them in watermark order), never
against a wall clock, so a replay decides the same. The check runs every ``check_every_ms`` of
event time. Ranks whose process exit was seen are left to ``ProcessExitRule``. A resume
(checkpoint ``LOADED``) and a new replica of a rank (a higher binding epoch) start silence and
step intervals afresh.

Node silence (the same rule, so that it and ``rank_silent`` are decided by one state machine
and never both for the same loss): a node is known by its agent's periodic ``telemetry.node``
records filed under the job (``interval_ms`` says how often it sends); its ranks are those
whose reports were last located there (``subject.node``, which the agent stamps on what it
relays). The node is silent when nothing of it - no agent record (``telemetry.node`` or
``node.health``), no report of one of its ranks - came for
``max(node_k_intervals x its interval, node_floor_ms)``, and it holds at least one rank whose
exit was not seen: ``node_silent`` at ``Subject(node=N)``, evidence the agent's last record
and each rank's last sign of life. Meanwhile no ``rank_silent`` opens for a rank of that node
(the node verdict stands for them; one opened before the node went silent stays). It resolves
when the node is heard again (an agent record or a report located there), or when none of the
job's ranks is there any more (each rebound at a new epoch or reporting from another node:
the job left it).

``ProcessExitRule``: a rank process ended with a non-zero code, a signal, or a status nobody
could read (the agent is not its parent: under Slurm ``slurmstepd`` reaps it before the
agent sees the zombie; only exit code 0 with no signal is clean); resolved when the
rank reports a step after it (a new process took over: the engine has already dropped the
reports and exits of replicas older than the newest binding epoch).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    DepartureCause,
    ExitEvidence,
    Heartbeat,
    NodeHealth,
    NodeTelemetry,
    ProcessExit,
    StepReport,
    VerdictKind,
)
from trainguard.rules.base import Context, RuleBase, num
from trainguard.rules.stats import median

_INTERVALS = 64


@dataclass(slots=True)
class Agent:
    """A node's agent as its records show it (JSON: ``[last, interval_ms, record]``)."""

    last: int  # its last record's time
    interval_ms: float  # how often it sends telemetry
    record: str  # that last record's type

    def doc(self) -> list[Any]:
        return [self.last, self.interval_ms, self.record]

    @classmethod
    def from_doc(cls, doc: list[Any]) -> Agent:
        return cls(int(doc[0]), doc[1], str(doc[2]))


@dataclass(slots=True)
class LivenessState:
    """The liveness rule's state (JSON via ``doc``/``from_doc``, one key per field)."""

    seen: dict[str, int] = field(default_factory=dict)  # rank -> last sign of life
    step_t: dict[str, int] = field(default_factory=dict)  # rank -> last step report time
    node: dict[str, str] = field(default_factory=dict)  # rank -> where it last reported from
    iv: list[int] = field(default_factory=list)  # the job's last step intervals (µs)
    exited: list[str] = field(default_factory=list)  # ranks whose exit was seen, sorted
    next: int = -1  # event time of the next check
    step: dict[str, int] = field(default_factory=dict)  # rank -> its last step
    agent: dict[str, Agent] = field(default_factory=dict)  # node -> its agent

    def doc(self) -> dict[str, Any]:
        return {"seen": self.seen, "step_t": self.step_t, "node": self.node, "iv": self.iv,
                "exited": self.exited, "next": self.next, "step": self.step,
                "agent": {n: a.doc() for n, a in self.agent.items()}}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> LivenessState:
        """Keys missing (an older layout) take their initial values."""
        return cls(seen={str(r): int(t) for r, t in doc.get("seen", {}).items()},
                   step_t={str(r): int(t) for r, t in doc.get("step_t", {}).items()},
                   node={str(r): str(n) for r, n in doc.get("node", {}).items()},
                   iv=[int(x) for x in doc.get("iv", [])],
                   exited=[str(r) for r in doc.get("exited", [])],
                   next=int(doc.get("next", -1)),
                   step={str(r): int(n) for r, n in doc.get("step", {}).items()},
                   agent={str(n): Agent.from_doc(a) for n, a in doc.get("agent", {}).items()})


class LivenessRule(RuleBase):
    kinds = frozenset({VerdictKind.RANK_SILENT, VerdictKind.NODE_SILENT})
    types = frozenset({"step.report", "heartbeat", "process.exit", "telemetry.node",
                       "node.health", "checkpoint"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.st = LivenessState()

    def state_doc(self) -> dict[str, Any]:
        return self.st.doc()

    def load_state(self, doc: dict[str, Any]) -> None:
        self.st = LivenessState.from_doc(doc)

    def feed(self, event: Event) -> list[Event]:
        s = self.st
        t = event.event_time
        out: list[Event] = []
        payload = event.payload
        kind = type(payload)
        if kind is StepReport or kind is Heartbeat:
            report = cast(StepReport | Heartbeat, payload)
            rank = str(report.rank)
            s.seen[rank] = t
            node = event.subject.node
            if node is not None:
                was = s.node.get(rank)
                s.node[rank] = node
                if self.book.open:
                    out.extend(self._heard(node, t, event.type))
                    if was is not None and was != node:
                        out.extend(self._left(was, t))
            if report.step is not None:
                s.step[rank] = report.step
            if s.exited and rank in s.exited:
                s.exited.remove(rank)
            if kind is StepReport:
                last = s.step_t.get(rank)
                if last is not None and t > last:
                    s.iv.append(t - last)
                    if len(s.iv) > _INTERVALS:
                        del s.iv[0]
                s.step_t[rank] = t
            if self.book.open:
                key = f"rank:{rank}"
                if key in self.book.open:
                    gap = (t - self.book.open[key].first) / 1000
                    out.extend(self.book.resolve(key, decided_time=t,
                                                 evidence={"silent_ms": num(gap)}))
        elif kind is CheckpointEvent:
            if cast(CheckpointEvent, payload).action is CheckpointAction.LOADED:
                # a resume starts every rank's silence afresh (the restart is no silence)
                for rank in s.seen:
                    s.seen[rank] = t
                s.step_t = {}
        elif kind is ProcessExit:
            ex = cast(ProcessExit, payload)
            if ex.rank is not None and str(ex.rank) not in s.exited:
                s.exited.append(str(ex.rank))
                s.exited.sort()
        elif kind is NodeTelemetry or kind is NodeHealth:
            node = event.subject.node
            agent = None if node is None else s.agent.get(node)
            if kind is NodeTelemetry and node is not None:
                # the periodic record: it makes the node's agent known, with its interval
                s.agent[node] = Agent(t, cast(NodeTelemetry, payload).interval_ms, event.type)
            elif agent is not None:  # a discrete record only counts for an agent known
                agent.last, agent.record = t, event.type
            if node is not None and self.book.open:
                out.extend(self._heard(node, t, event.type))
        if t >= s.next:
            s.next = t + int(self.p["check_every_ms"] * 1000)
            out.extend(self._check(t))
        return out

    def rebind(self, rank: str, event: Event) -> list[Event]:
        # the gap between the old replica's last step and the new one's first is no interval;
        # the new replica's silence starts at its binding, and it is at no node until it
        # reports from one (a node the job left holds no rank of it)
        s = self.st
        s.step_t.pop(rank, None)
        if rank in s.seen:
            s.seen[rank] = max(s.seen[rank], event.event_time)
        node = s.node.pop(rank, None)
        return [] if node is None else self._left(node, event.event_time)

    def timeout_us(self) -> int:
        floor = self.p["floor_ms"] * 1000
        iv = self.st.iv
        return int(max(self.p["k_step_times"] * median(iv), floor) if iv else floor)

    def node_timeout_us(self, interval_ms: float) -> int:
        return int(max(self.p["node_k_intervals"] * interval_ms, self.p["node_floor_ms"]) * 1000)

    def _heard(self, node: str, t: int, what: str) -> list[Event]:
        key = f"node:{node}"
        opened = self.book.open.get(key)
        if opened is None:
            return []
        return self.book.resolve(key, decided_time=t, evidence={
            "silent_ms": num((t - opened.first) / 1000), "heard": what})

    def _left(self, node: str, t: int) -> list[Event]:
        """A rank is no longer at ``node``: the job left it once none is."""
        key = f"node:{node}"
        if key not in self.book.open or node in self.st.node.values():
            return []
        return self.book.resolve(key, decided_time=t, evidence={"left": True})

    def _check_nodes(self, t: int) -> list[Event]:
        s = self.st
        by_node: dict[str, list[str]] = {}
        for rank in sorted(s.node, key=int):
            by_node.setdefault(s.node[rank], []).append(rank)
        out: list[Event] = []
        for node in sorted(s.agent):
            key = f"node:{node}"
            ranks = by_node.get(node)
            if not ranks or self.book.is_open(key):
                continue
            running = [r for r in ranks if r not in s.exited]
            if not running:
                continue  # every rank it held ended: process_exit has them
            agent = s.agent[node]
            agent_last, interval_ms, what = agent.last, agent.interval_ms, agent.record
            lasts = [s.seen[r] for r in ranks]
            first = max(agent_last, *lasts)
            timeout = self.node_timeout_us(interval_ms)
            if t - first <= timeout:
                continue
            steps = [s.step[r] for r in ranks if r in s.step]
            out.extend(self.book.raise_(
                key, kind=VerdictKind.NODE_SILENT, subject=Subject(node=node), severity=None,
                first_time=first, decided_time=t,
                evidence={"silent_ms": num((t - first) / 1000),
                          "timeout_ms": num(timeout / 1000),
                          "agent_last_time": agent_last, "agent_last_record": what,
                          "agent_interval_ms": num(interval_ms),
                          "ranks": [int(r) for r in ranks],
                          "rank_last_times": list(lasts),
                          "ranks_exited": [int(r) for r in ranks if r in s.exited],
                          "ranks_last_step": max(steps) if steps else None,
                          "job_last_step": max(s.step.values()) if s.step else None}))
        return out

    def _check(self, t: int) -> list[Event]:
        s = self.st
        out: list[Event] = self._check_nodes(t) if s.agent else []
        timeout = self.timeout_us()
        for rank in sorted(s.seen, key=int):
            last = s.seen[rank]
            key = f"rank:{rank}"
            if t - last > timeout and rank not in s.exited and not self.book.is_open(key):
                node = s.node.get(rank)
                if node is not None and self.book.is_open(f"node:{node}"):
                    continue  # its node's verdict stands for it
                med = median(s.iv) / 1000 if s.iv else None
                out.extend(self.book.raise_(
                    key, kind=VerdictKind.RANK_SILENT, subject=Subject(rank=int(rank),
                                                             node=s.node.get(rank)),
                    severity=None, first_time=last, decided_time=t,
                    evidence={"silent_ms": num((t - last) / 1000),
                              "timeout_ms": num(timeout / 1000),
                              "median_step_ms": None if med is None else num(med)}))
        return out


class ProcessExitRule(RuleBase):
    kinds = frozenset({VerdictKind.PROCESS_EXIT})
    types = frozenset({"process.exit", "step.report"})
    prompt_types = frozenset({"process.exit"})

    def feed(self, event: Event) -> list[Event]:
        payload = event.payload
        if type(payload) is StepReport:
            if not self.book.open:
                return []
            key = f"rank:{payload.rank}"
            opened = self.book.open.get(key)
            # a report after the exit is a new process's (the engine drops stale replicas')
            if opened is None or event.event_time <= opened.first:
                return []
            return self.book.resolve(key, decided_time=event.event_time,
                                     evidence={"step": payload.step,
                                               "binding_epoch": payload.binding_epoch})
        found = self._exit(event)
        return [] if found is None else self.book.raise_(found[0], **found[1])

    def prompt(self, event: Event) -> list[Event]:
        found = self._exit(event)
        return [] if found is None else self.book.preview(found[0], **found[1])

    def _exit(self, event: Event) -> tuple[str, dict[str, Any]] | None:
        ex = cast(ProcessExit, event.payload)
        clean = _clean(ex)
        if clean and self.p["ignore_clean_exit"]:
            return None
        key = f"rank:{ex.rank}" if ex.rank is not None else f"pid:{event.subject.node}:{ex.pid}"
        t = event.event_time
        return key, {"kind": VerdictKind.PROCESS_EXIT, "subject": Subject(node=event.subject.node,
                                                                rank=ex.rank),
                     "severity": None, "first_time": t, "decided_time": t,
                     "evidence": {**ExitEvidence(pid=ex.pid, exit_code=ex.exit_code,
                                                 signal=ex.signal,
                                                 binding_epoch=ex.binding_epoch,
                                                 declared_code=ex.declared_code,
                                                 declared_cause=ex.declared_cause
                                                 ).as_evidence(),
                                  "detected_by": ex.detected_by,
                                  **({} if ex.declared_reason is None
                                     else {"declared_reason": ex.declared_reason})}}


def _clean(ex: ProcessExit) -> bool:
    """Exited 0 by its read status; or, when no status could be read (an unread status is no
    proof of health), the rank said it completed with 0 just before it ended."""
    if ex.signal is not None:
        return False
    if ex.exit_code is not None:
        return ex.exit_code == 0
    return ex.declared_cause is DepartureCause.COMPLETED and ex.declared_code == 0
