"""Hang by section: "rank R stuck in <section> for T s", with bounds learned per section.

The SDK's heartbeats (v2) carry the section of its step a rank is in (``Section``) and since
when (the trainer's clock, like every event time: its first heartbeat in that instance, so at
most one heartbeat interval after it entered it; stuck times are short by up to that much).
``SectionHangRule`` tracks each rank's current section *instance* (section, start) and
learns, per section of the job, how long an instance takes:

- An instance ends when the rank shows a newer one (its start ends the old: sections of one
  training thread follow each other), a heartbeat with no section (at that heartbeat's time), or
  a step report (at its time; ``step()`` ends the section). These ends are upper bounds on the
  duration, loose by at most one heartbeat interval: the safe side for a timeout. Only instances
  a heartbeat saw are learned from; short ones mostly are not, and need not be.
- Bound of a section = ``max(floor_ms, k x the longest of its last window_n durations)`` once
  ``min_observations`` instances of it ended, ``initial_ms`` before (NVIDIA's resiliency
  extension does the same: a generous initial timeout, then a multiple of the observed maximum).
  ``checkpoint`` is judged on its own terms: its own initial bound and observation count (saves
  are rare and long); an instance that was flagged is not learned from.
- Every ``check_every_ms`` of event time, a rank whose instance is older than its section's
  bound is stuck: a verdict ``rank_stuck`` naming the section, opened at the instance's start.
  Time is the event time of the job's events (any rank's), so a rank frozen whole (SIGSTOP: no
  heartbeats at all) is judged by its peers' events, and a replay decides the same.
- ``comm`` (waiting in the gradient exchange after the rank's last bucket) is the section a
  healthy rank waits in while a peer is stuck elsewhere: a rank stuck in ``comm`` is flagged
  only when every rank of the job known to the rule is in ``comm`` too (a hang of the exchange
  itself); otherwise the peer that is not waiting is the one to blame, in its own section.
- The verdict resolves when the rank's instance ends (a newer section, a step, no section) or
  its process exits (``process_exit`` takes over). A resume (checkpoint ``loaded``) and a new
  replica (``rebind``) start the rank(s) afresh; learned durations are kept (same job, same
  model).

The state is typed (``SectionHangState``) and snapshots to plain JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    Heartbeat,
    ProcessExit,
    Section,
    StepReport,
    VerdictKind,
)
from trainguard.rules.base import Context, RuleBase, num


@dataclass(slots=True)
class Instance:
    """The section a rank is in, since ``start`` (µs)."""

    section: Section
    start: int
    node: str | None = None
    step: int | None = None  # the last step the rank finished


@dataclass(slots=True)
class SectionHangState:
    """JSON via ``doc``/``from_doc``; keys missing (an older layout) take their initial
    values."""

    current: dict[int, Instance] = field(default_factory=dict)
    # rank -> start of the newest instance that ended (older instances shown later are stale)
    ended: dict[int, int] = field(default_factory=dict)
    durations: dict[Section, list[int]] = field(default_factory=dict)  # µs, newest last
    next_check: int = -1

    def doc(self) -> dict[str, Any]:
        return {"current": {str(r): [i.section.value, i.start, i.node, i.step]
                            for r, i in self.current.items()},
                "ended": {str(r): t for r, t in self.ended.items()},
                "durations": {s.value: d for s, d in self.durations.items()},
                "next_check": self.next_check}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> SectionHangState:
        return cls(
            current={int(r): Instance(Section(v[0]), int(v[1]), v[2], v[3])
                     for r, v in doc.get("current", {}).items()},
            ended={int(r): int(t) for r, t in doc.get("ended", {}).items()},
            durations={Section(s): [int(x) for x in d]
                       for s, d in doc.get("durations", {}).items()},
            next_check=int(doc.get("next_check", -1)))


@dataclass(frozen=True)
class Bound:
    timeout_us: int
    learned: bool
    observations: int


class SectionHangRule(RuleBase):
    kinds = frozenset({VerdictKind.RANK_STUCK})
    types = frozenset({"heartbeat", "step.report", "process.exit", "checkpoint"})

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.st = SectionHangState()

    # -- feed -------------------------------------------------------------------------------

    def feed(self, event: Event) -> list[Event]:
        t = event.event_time
        payload = event.payload
        out: list[Event] = []
        if isinstance(payload, Heartbeat):
            out.extend(self._heartbeat(payload, event.subject.node, t))
        elif isinstance(payload, StepReport):
            out.extend(self._end(payload.rank, t, t))
        elif isinstance(payload, ProcessExit):
            if payload.rank is not None:
                out.extend(self._end(payload.rank, t, None, learn=False))
        elif isinstance(payload, CheckpointEvent) and payload.action is CheckpointAction.LOADED:
            for rank in sorted(self.st.current):
                out.extend(self._end(rank, t, None, learn=False))
        if t >= self.st.next_check:
            self.st.next_check = t + int(self.p["check_every_ms"] * 1000)
            out.extend(self._check(t))
        return out

    def rebind(self, rank: str, event: Event) -> list[Event]:
        r = int(rank)
        out = self._end(r, event.event_time, None, learn=False)
        self.st.ended.pop(r, None)
        return out

    def _heartbeat(self, hb: Heartbeat, node: str | None, t: int) -> list[Event]:
        rank = hb.rank
        if hb.section is None or hb.section_start is None:
            return self._end(rank, t, t)
        start = hb.section_start
        ended = self.st.ended.get(rank)
        if ended is not None and start <= ended:
            return []  # an instance that already ended (a heartbeat raced the step)
        cur = self.st.current.get(rank)
        out: list[Event] = []
        if cur is not None and (cur.section, cur.start) == (hb.section, start):
            cur.node, cur.step = node or cur.node, hb.step
            return out
        if cur is not None:
            out.extend(self._end(rank, t, min(start, t)))
        self.st.current[rank] = Instance(hb.section, start, node, hb.step)
        return out

    def _end(self, rank: int, t: int, end: int | None, *, learn: bool = True) -> list[Event]:
        """The rank's current instance ended at ``end`` (None: unknown, not learned from)."""
        cur = self.st.current.pop(rank, None)
        if cur is None:
            return []
        self.st.ended[rank] = cur.start
        key = f"rank:{rank}"
        flagged = self.book.is_open(key)
        if learn and end is not None and not flagged:
            d = self.st.durations.setdefault(cur.section, [])
            d.append(max(end - cur.start, 0))
            if len(d) > self.p["window_n"]:
                del d[0]
        if not flagged:
            return []
        return self.book.resolve(key, decided_time=t, evidence={
            "section": cur.section.value, "stuck_ms": num((t - cur.start) / 1000)})

    # -- judge ------------------------------------------------------------------------------

    def bound(self, section: Section) -> Bound:
        ckpt = section is Section.CHECKPOINT
        need = self.p["checkpoint_min_observations" if ckpt else "min_observations"]
        seen = self.st.durations.get(section, [])
        if len(seen) < need:
            initial = self.p["checkpoint_initial_ms" if ckpt else "initial_ms"]
            return Bound(int(initial * 1000), False, len(seen))
        timeout = max(self.p["floor_ms"] * 1000, self.p["k"] * max(seen))
        return Bound(int(timeout), True, len(seen))

    def _check(self, t: int) -> list[Event]:
        cur = self.st.current
        all_comm = all(i.section is Section.COMM for i in cur.values())
        waiting = sum(1 for i in cur.values() if i.section is Section.COMM)
        out: list[Event] = []
        for rank in sorted(cur):
            inst = cur[rank]
            key = f"rank:{rank}"
            if self.book.is_open(key) or (inst.section is Section.COMM and not all_comm):
                continue
            b = self.bound(inst.section)
            stuck = t - inst.start
            if stuck <= b.timeout_us:
                continue
            out.extend(self.book.raise_(
                key, kind=VerdictKind.RANK_STUCK, subject=Subject(rank=rank, node=inst.node),
                severity=None, first_time=inst.start, decided_time=t,
                evidence={"section": inst.section.value, "stuck_ms": num(stuck / 1000),
                          "timeout_ms": num(b.timeout_us / 1000), "learned": b.learned,
                          "observations": b.observations, "last_step": inst.step,
                          "peers_waiting_in_comm": waiting - (inst.section is Section.COMM)}))
        return out

    # -- state ------------------------------------------------------------------------------

    def state_doc(self) -> dict[str, Any]:
        return self.st.doc()

    def load_state(self, doc: dict[str, Any]) -> None:
        self.st = SectionHangState.from_doc(doc)
