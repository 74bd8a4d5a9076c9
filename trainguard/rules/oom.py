"""OOM kills (kernel log, ``node.health`` ``OOM_KILL``; ``code`` is the victim's pid).

The rule learns which pid is which rank from what the job itself says: step reports and
heartbeats (``pid``), process exits and the agent's process samples (``pid`` + ``rank``).

- The victim is a rank's current process -> a critical ``oom_kill`` verdict at the rank (and
  its node): a failure, as a process exit is (docs/rules.md). It resolves when the rank reports
  a step after the kill (a new process took over).
- Any other process -> a ``oom_kill_process`` verdict (``process_severity``, warning) at the
  node: memory pressure on a node the job may share, no rank lost. It resolves after
  ``resolve_quiet_ms`` of event time without another kill on that node.

The same pid reported twice (``oom-kill:`` then ``Killed process``, ``oom_reaper``) opens once.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import (
    Heartbeat,
    NodeHealth,
    NodeHealthKind,
    NodeTelemetry,
    ProcessExit,
    Severity,
    StepReport,
    VerdictKind,
)
from trainguard.rules.base import Context, RuleBase

MESSAGE_EVIDENCE = 240


class ProcessOf(NamedTuple):
    """A rank's latest known process (JSON: ``[pid, node]``)."""

    pid: int
    node: str | None


class OomKillRule(RuleBase):
    kinds = frozenset({VerdictKind.OOM_KILL, VerdictKind.OOM_KILL_PROCESS})
    types = frozenset({"node.health", "step.report", "heartbeat", "process.exit",
                       "telemetry.node"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.pids: dict[str, ProcessOf] = {}  # rank -> its latest known process
        self.last: dict[str, int] = {}  # "node:N" -> time of its latest non-rank kill (open)

    def state_doc(self) -> dict[str, Any]:
        return {"pids": {r: list(p) for r, p in self.pids.items()}, "last": self.last}

    def load_state(self, doc: dict[str, Any]) -> None:
        """Keys missing (an older layout) take their initial values."""
        self.pids = {str(r): ProcessOf(int(p[0]), None if p[1] is None else str(p[1]))
                     for r, p in doc.get("pids", {}).items()}
        self.last = {str(k): int(t) for k, t in doc.get("last", {}).items()}

    def feed(self, event: Event) -> list[Event]:
        t = event.event_time
        out = self._quiet(t) if self.last else []
        p = event.payload
        kind = type(p)
        node = event.subject.node
        if kind is StepReport or kind is Heartbeat:
            report: StepReport | Heartbeat = p  # type: ignore[assignment]
            rank = str(report.rank)
            if report.pid is not None:
                self._learn(rank, report.pid, node)
            if kind is StepReport and self.book.open:
                opened = self.book.open.get(f"rank:{rank}")
                if opened is not None and t > opened.first:
                    out.extend(self.book.resolve(
                        f"rank:{rank}", decided_time=t,
                        evidence={"step": report.step,
                                  "binding_epoch": report.binding_epoch}))
        elif isinstance(p, ProcessExit):
            if p.rank is not None and str(p.rank) not in self.pids:
                self._learn(str(p.rank), p.pid, node)
        elif isinstance(p, NodeTelemetry):
            for proc in p.processes:
                if proc.rank is not None and proc.job_id in (None, self.ctx.job_id):
                    self._learn(str(proc.rank), proc.pid, node)
        elif isinstance(p, NodeHealth) and p.kind is NodeHealthKind.OOM_KILL and \
                p.code is not None:
            out.extend(self._kill(p, node, t))
        return out

    def _learn(self, rank: str, pid: int, node: str | None) -> None:
        cur = self.pids.get(rank)
        if cur is None or cur.pid != pid or cur.node != node:
            self.pids[rank] = ProcessOf(pid, node)

    def _rank_of(self, pid: int, node: str | None) -> int | None:
        for rank, (rpid, rnode) in self.pids.items():
            if rpid == pid and (rnode is None or node is None or rnode == node):
                return int(rank)
        return None

    def _kill(self, h: NodeHealth, node: str | None, t: int) -> list[Event]:
        pid = h.code
        assert pid is not None
        evidence: dict[str, Any] = {"pid": pid, "constraint": h.fault_class,
                                    "origin": h.origin, "node": node,
                                    "message": h.message[:MESSAGE_EVIDENCE]}
        rank = self._rank_of(pid, node)
        if rank is not None:
            return self.book.raise_(f"rank:{rank}", kind=VerdictKind.OOM_KILL,
                                    subject=Subject(node=node, rank=rank), severity=None,
                                    first_time=t, decided_time=t, evidence=evidence)
        key = f"node:{node}"
        self.last[key] = t
        return self.book.raise_(key, kind=VerdictKind.OOM_KILL_PROCESS, subject=Subject(node=node),
                                severity=self._process_severity(), first_time=t,
                                decided_time=t, evidence=evidence)

    def _process_severity(self) -> Severity:
        return Severity(self.p["process_severity"])

    def _quiet(self, t: int) -> list[Event]:
        last = self.last
        if not last:
            return []
        quiet = int(self.p["resolve_quiet_ms"] * 1000)
        out: list[Event] = []
        for key in sorted(last):
            if t - last[key] > quiet:
                del last[key]
                out.extend(self.book.resolve(key, decided_time=t,
                                             evidence={"quiet_ms": self.p["resolve_quiet_ms"]}))
        return out
