"""Recorded vs replayed: verdicts by event id, incidents by id (and, for what-if, by where and
when they opened). Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from trainguard.events.clock import to_iso
from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentTransition, Verdict
from trainguard.incidents.model import order_key
from trainguard.incidents.query import canonical


@dataclass
class VerdictDiff:
    same: int = 0
    missing: list[Event] = field(default_factory=list)  # recorded, not replayed
    extra: list[Event] = field(default_factory=list)  # replayed, not recorded
    changed: list[tuple[Event, Event]] = field(default_factory=list)  # (recorded, replayed)

    @property
    def exact(self) -> bool:
        return not (self.missing or self.extra or self.changed)


def _unversioned(e: Event) -> bytes:
    p = e.payload
    assert isinstance(p, Verdict)
    return canonical(e.model_copy(update={"payload": p.model_copy(
        update={"rules_version": None})}))


def diff_verdicts(recorded: Sequence[Event], replayed: Sequence[Event], *,
                  ignore_version: bool = False) -> VerdictDiff:
    """``ignore_version``: for what-if, a verdict the other rules decide identically is the
    same verdict even though it names another rules version."""
    key = _unversioned if ignore_version else canonical
    rec = {e.event_id: e for e in recorded}
    rep = {e.event_id: e for e in replayed}
    out = VerdictDiff()
    for eid in sorted(rec.keys() | rep.keys(), key=lambda i: order_key(rec.get(i) or rep[i])):
        a, b = rec.get(eid), rep.get(eid)
        if a is None:
            assert b is not None
            out.extra.append(b)
        elif b is None:
            out.missing.append(a)
        elif key(a) == key(b):
            out.same += 1
        else:
            out.changed.append((a, b))
    return out


@dataclass(frozen=True)
class IncidentSummary:
    incident_id: str
    job_id: str
    subject: str
    opened_at: int
    opened_by: str  # the reason of the first transition: severity and verdict kind
    final_state: str
    tier: int | None
    path: tuple[str, ...]  # the states it went through

    def line(self) -> str:
        tier = f" tier {self.tier}" if self.tier is not None else ""
        return (f"{self.incident_id[:12]} job {self.job_id} at {self.subject or 'the job'}, "
                f"opened {to_iso(self.opened_at)} ({self.opened_by}) -> "
                f"{self.final_state}{tier}")


@dataclass(frozen=True)
class IncidentChange:
    recorded: IncidentSummary
    replayed: IncidentSummary
    differences: tuple[str, ...]


@dataclass
class IncidentDiff:
    same: list[IncidentSummary] = field(default_factory=list)
    appear: list[IncidentSummary] = field(default_factory=list)
    vanish: list[IncidentSummary] = field(default_factory=list)
    change: list[IncidentChange] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not (self.appear or self.vanish or self.change)


def group(transitions: Sequence[Event]) -> dict[str, list[Event]]:
    out: dict[str, dict[str, Event]] = defaultdict(dict)
    for t in transitions:
        p = t.payload
        assert isinstance(p, IncidentTransition)
        out[p.incident_id][t.event_id] = t
    return {iid: sorted(ts.values(), key=_seq) for iid, ts in out.items()}


def _seq(e: Event) -> int:
    p = e.payload
    assert isinstance(p, IncidentTransition)
    return p.seq


def summarise(transitions: list[Event]) -> IncidentSummary:
    first, last = transitions[0], transitions[-1]
    p0, pn = first.payload, last.payload
    assert isinstance(p0, IncidentTransition) and isinstance(pn, IncidentTransition)
    subject = ", ".join(f"{k} {v}" for k, v in first.subject.model_dump(exclude_none=True).items())
    path = tuple(_state(t) for t in transitions)
    return IncidentSummary(p0.incident_id, first.job_id, subject, first.event_time, p0.reason,
                           pn.to_state.value, pn.tier, path)


def _state(t: Event) -> str:
    p = t.payload
    assert isinstance(p, IncidentTransition)
    return p.to_state.value + (f"({p.tier})" if p.tier is not None else "")


def _differences(rec: list[Event], rep: list[Event]) -> tuple[str, ...]:
    out: list[str] = []
    for i in range(max(len(rec), len(rep))):
        a = rec[i] if i < len(rec) else None
        b = rep[i] if i < len(rep) else None
        if a is not None and b is not None and canonical(a) == canonical(b):
            continue
        out.append(f"seq {i}: recorded {_describe(a)}; replayed {_describe(b)}")
    return tuple(out)


def _describe(t: Event | None) -> str:
    if t is None:
        return "nothing"
    p = t.payload
    assert isinstance(p, IncidentTransition)
    return f"-> {_state(t)} at {to_iso(t.event_time)} ({p.reason})"


def diff_incidents(recorded: Sequence[Event], replayed: Sequence[Event],
                   match_within_us: int = 30_000_000) -> IncidentDiff:
    rec, rep = group(recorded), group(replayed)
    out = IncidentDiff()
    for iid in sorted(rec.keys() & rep.keys()):
        seq_diffs = _differences(rec[iid], rep[iid])
        if seq_diffs:
            out.change.append(IncidentChange(summarise(rec[iid]), summarise(rep[iid]),
                                             seq_diffs))
        else:
            out.same.append(summarise(rec[iid]))
    gone = [summarise(rec[i]) for i in sorted(rec.keys() - rep.keys())]
    new = [summarise(rep[i]) for i in sorted(rep.keys() - rec.keys())]
    for old in sorted(gone, key=lambda s: s.opened_at):
        twin = _twin(old, new, match_within_us)
        if twin is None:
            out.vanish.append(old)
            continue
        new.remove(twin)
        diffs: list[str] = [f"opened {to_iso(twin.opened_at)} instead of {to_iso(old.opened_at)}"
                 f" ({twin.opened_by})"] if twin.opened_at != old.opened_at else []
        if twin.path != old.path:
            diffs.append(f"states {' > '.join(twin.path)} instead of {' > '.join(old.path)}")
        out.change.append(IncidentChange(old, twin, tuple(diffs) or ("another opening verdict",)))
    out.appear = sorted(new, key=lambda s: s.opened_at)
    return out


def _twin(old: IncidentSummary, candidates: list[IncidentSummary], within: int
          ) -> IncidentSummary | None:
    """The replayed incident that is the same fault: same job and subject, opened nearby."""
    near = [c for c in candidates if c.job_id == old.job_id and c.subject == old.subject
            and abs(c.opened_at - old.opened_at) <= within]
    return min(near, key=lambda c: abs(c.opened_at - old.opened_at), default=None)


def verdict_line(e: Event) -> str:
    p = e.payload
    assert isinstance(p, Verdict)
    where = ", ".join(f"{k} {v}" for k, v in e.subject.model_dump(exclude_none=True).items())
    return (f"{to_iso(e.event_time)} {p.state.value} {p.kind} ({p.severity.value}, rule "
            f"{p.rule}) at {where or 'the job'} [{p.rules_version}]")
