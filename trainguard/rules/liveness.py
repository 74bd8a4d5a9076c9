"""Failure by silence or by exit.

``LivenessRule``: a rank is silent when no step report or heartbeat of it arrived for
``max(k_step_times x the job's median step interval, floor_ms)``. Silence is measured in event
time against the other events of the job (the engine releases them in watermark order), never
against a wall clock, so a replay decides the same. The check runs every ``check_every_ms`` of
event time. Ranks whose process exit was seen are left to ``ProcessExitRule``.

``ProcessExitRule``: a rank process ended with a non-zero code or a signal; resolved when the
rank reports a step again (a new process took over).
"""

from __future__ import annotations

from typing import Any, cast

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import Heartbeat, ProcessExit, StepReport
from trainguard.rules.base import RuleBase, num
from trainguard.rules.stats import median

_INTERVALS = 64


class LivenessRule(RuleBase):
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
        elif kind is ProcessExit:
            ex = cast(ProcessExit, payload)
            if ex.rank is not None and str(ex.rank) not in s["exited"]:
                s["exited"].append(str(ex.rank))
                s["exited"].sort()
        if t >= s["next"]:
            s["next"] = t + int(self.p["check_every_ms"] * 1000)
            out.extend(self._check(t))
        return out

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
                    key, kind="rank_silent", subject=Subject(rank=int(rank),
                                                             node=s["node"].get(rank)),
                    severity=None, first_time=last, decided_time=t,
                    evidence={"silent_ms": num((t - last) / 1000),
                              "timeout_ms": num(timeout / 1000),
                              "median_step_ms": None if med is None else num(med)}))
        return out


class ProcessExitRule(RuleBase):
    types = frozenset({"process.exit", "step.report"})

    def feed(self, event: Event) -> list[Event]:
        payload = event.payload
        if type(payload) is StepReport:
            if not self.book.open:
                return []
            return self.book.resolve(f"rank:{payload.rank}", decided_time=event.event_time,
                                     evidence={"step": payload.step})
        ex = cast(ProcessExit, payload)
        clean = (ex.exit_code in (0, None)) and ex.signal is None
        if clean and self.p["ignore_clean_exit"]:
            return []
        key = f"rank:{ex.rank}" if ex.rank is not None else f"pid:{event.subject.node}:{ex.pid}"
        subject = Subject(node=event.subject.node, rank=ex.rank)
        return self.book.raise_(key, kind="process_exit", subject=subject, severity=None,
                                first_time=event.event_time, decided_time=event.event_time,
                                evidence={"pid": ex.pid, "exit_code": ex.exit_code,
                                          "signal": ex.signal, "detected_by": ex.detected_by})
