"""Failure by silence or by exit.

``LivenessRule``: a rank is silent when no step report or heartbeat of it arrived for
``max(k_step_times x the job's median step interval, floor_ms)``. Silence is measured in event
time against the other events of the job (the engine releases them in watermark order), never
against a wall clock, so a replay decides the same. The check runs every ``check_every_ms`` of
event time. Ranks whose process exit was seen are left to ``ProcessExitRule``. A resume
(checkpoint ``LOADED``) and a new replica of a rank (a higher binding epoch) start silence and
step intervals afresh.

``ProcessExitRule``: a rank process ended with a non-zero code or a signal; resolved when the
rank reports a step after it (a new process took over: the engine has already dropped the
reports and exits of replicas older than the newest binding epoch).
"""

from __future__ import annotations

from typing import Any, cast

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    ExitEvidence,
    Heartbeat,
    ProcessExit,
    StepReport,
    VerdictKind,
)
from trainguard.rules.base import RuleBase, num
from trainguard.rules.stats import median

_INTERVALS = 64


class LivenessRule(RuleBase):
    kinds = frozenset({VerdictKind.RANK_SILENT})
    types = frozenset({"step.report", "heartbeat", "process.exit", "telemetry.node",
                       "node.health", "checkpoint"})

    def initial_state(self) -> dict[str, Any]:
        # seen: rank -> last sign of life; step_t: rank -> last step report time
        return {"seen": {}, "step_t": {}, "node": {}, "iv": [], "exited": [], "next": -1}

    def feed(self, event: Event) -> list[Event]:
        s = self.s
        t = event.event_time
        out: list[Event] = []
        payload = event.payload
        kind = type(payload)
        if kind is StepReport or kind is Heartbeat:
            rank = str(cast(StepReport | Heartbeat, payload).rank)
            s["seen"][rank] = t
            if event.subject.node is not None:
                s["node"][rank] = event.subject.node
            if s["exited"] and rank in s["exited"]:
                s["exited"].remove(rank)
            if kind is StepReport:
                last = s["step_t"].get(rank)
                if last is not None and t > last:
                    s["iv"].append(t - last)
                    if len(s["iv"]) > _INTERVALS:
                        del s["iv"][0]
                s["step_t"][rank] = t
            if self.book.open:
                key = f"rank:{rank}"
                if key in self.book.open:
                    gap = (t - self.book.open[key]["first"]) / 1000
                    out.extend(self.book.resolve(key, decided_time=t,
                                                 evidence={"silent_ms": num(gap)}))
        elif kind is CheckpointEvent:
            if cast(CheckpointEvent, payload).action is CheckpointAction.LOADED:
                # a resume starts every rank's silence afresh (the restart is no silence)
                for rank in s["seen"]:
                    s["seen"][rank] = t
                s["step_t"] = {}
        elif kind is ProcessExit:
            ex = cast(ProcessExit, payload)
            if ex.rank is not None and str(ex.rank) not in s["exited"]:
                s["exited"].append(str(ex.rank))
                s["exited"].sort()
        if t >= s["next"]:
            s["next"] = t + int(self.p["check_every_ms"] * 1000)
            out.extend(self._check(t))
        return out

    def rebind(self, rank: str, event: Event) -> list[Event]:
        # the gap between the old replica's last step and the new one's first is no interval
        self.s["step_t"].pop(rank, None)
        return []

    def timeout_us(self) -> int:
        floor = self.p["floor_ms"] * 1000
        iv = self.s["iv"]
        return int(max(self.p["k_step_times"] * median(iv), floor) if iv else floor)

    def _check(self, t: int) -> list[Event]:
        s = self.s
        timeout = self.timeout_us()
        out: list[Event] = []
        for rank in sorted(s["seen"], key=int):
            last = s["seen"][rank]
            key = f"rank:{rank}"
            if t - last > timeout and rank not in s["exited"] and not self.book.is_open(key):
                med = median(s["iv"]) / 1000 if s["iv"] else None
                out.extend(self.book.raise_(
                    key, kind=VerdictKind.RANK_SILENT, subject=Subject(rank=int(rank),
                                                             node=s["node"].get(rank)),
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
            doc = self.book.open.get(key)
            # a report after the exit is a new process's (the engine drops stale replicas')
            if doc is None or event.event_time <= doc["first"]:
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
        clean = (ex.exit_code in (0, None)) and ex.signal is None
        if clean and self.p["ignore_clean_exit"]:
            return None
        key = f"rank:{ex.rank}" if ex.rank is not None else f"pid:{event.subject.node}:{ex.pid}"
        t = event.event_time
        return key, {"kind": VerdictKind.PROCESS_EXIT, "subject": Subject(node=event.subject.node,
                                                                rank=ex.rank),
                     "severity": None, "first_time": t, "decided_time": t,
                     "evidence": {**ExitEvidence(pid=ex.pid, exit_code=ex.exit_code,
                                                 signal=ex.signal).as_evidence(),
                                  "detected_by": ex.detected_by,
                                  "binding_epoch": ex.binding_epoch}}
