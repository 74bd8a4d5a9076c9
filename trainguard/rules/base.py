"""The evaluator interface and what every rule shares: its context and its open verdicts.

An evaluator is a deterministic state machine over events that are already in event-time
order (the engine's reorder buffer sees to that). It reads no clock and does no I/O: the time
of a decision is the event time of the event that made it. Its state is plain JSON
(``snapshot()`` / ``restore()``) so a faust table can hold it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import orjson

from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import Severity, Verdict, VerdictKind, VerdictState
from trainguard.rules.schema import RuleSpec

SOURCE = "trainguard.rules"
Evidence = dict[str, Any]  # flat: scalars or lists of scalars (FlatMap)


class Evaluator(Protocol):
    """One rule over one job's time-ordered events."""

    types: ClassVar[frozenset[str]]  # event types the rule reads

    def feed(self, event: Event) -> list[Event]:
        """Take the next event (in event-time order); return the verdict events it decides."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """The whole state as JSON-serialisable data."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a ``snapshot()``."""
        ...


@dataclass(frozen=True)
class Context:
    job_id: str
    rules_version: str
    rule: RuleSpec


def num(x: float, digits: int = 4) -> float | str:
    """Evidence value: rounded so it prints the same everywhere; NaN/Inf as text."""
    if not math.isfinite(x):
        return str(x)
    return round(x, digits)


def subject_doc(subject: Subject) -> dict[str, Any]:
    return subject.model_dump(exclude_none=True)


@dataclass(slots=True)
class OpenVerdict:
    """A verdict opened and not resolved yet (JSON via ``doc``/``from_doc``: ``{"id", "kind",
    "sev", "first", "subject"}``)."""

    id: str  # the verdict id
    kind: VerdictKind
    sev: Severity
    first: int  # its first anomalous time (µs)
    subject: Subject

    def doc(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind.value, "sev": self.sev.value,
                "first": self.first, "subject": subject_doc(self.subject)}

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> OpenVerdict:
        return cls(str(doc["id"]), VerdictKind(doc["kind"]), Severity(doc["sev"]),
                   int(doc["first"]), Subject(**doc["subject"]))


class VerdictBook:
    """The open verdicts of one rule, by a key naming what is located (rank, GPU, link...).

    Opening something already open, or resolving something not open, gives nothing: the
    verdict stream has exactly one OPEN and at most one RESOLVED per anomaly.
    """

    def __init__(self, ctx: Context, kinds: frozenset[VerdictKind] = frozenset(VerdictKind)
                 ) -> None:
        self.ctx = ctx
        self.kinds = kinds  # what the rule declares it emits: anything else is a bug
        self.open: dict[str, OpenVerdict] = {}

    def doc(self) -> dict[str, Any]:
        """The open verdicts as JSON: key -> ``OpenVerdict.doc()``."""
        return {key: v.doc() for key, v in self.open.items()}

    def load(self, doc: dict[str, Any]) -> None:
        """Continue from a ``doc()``."""
        self.open = {str(key): OpenVerdict.from_doc(v) for key, v in doc.items()}

    def is_open(self, key: str) -> bool:
        return key in self.open

    def raise_(self, key: str, *, kind: VerdictKind, subject: Subject,
               severity: Severity | None, first_time: int, decided_time: int,
               evidence: Evidence) -> list[Event]:
        if key in self.open:
            return []
        self._declared(kind)
        sev = severity or self.ctx.rule.severity
        vid = derived_id(self.ctx.rule.id, self.ctx.job_id, key, first_time)
        self.open[key] = OpenVerdict(vid, kind, sev, first_time, subject)
        return [self._event(vid, kind, VerdictState.OPEN, sev, subject, first_time,
                            decided_time, evidence)]

    def preview(self, key: str, *, kind: VerdictKind, subject: Subject,
                severity: Severity | None, first_time: int, decided_time: int,
                evidence: Evidence) -> list[Event]:
        """What ``raise_`` would return now, changing nothing (the engine's prompt lane)."""
        if key in self.open:
            return []
        self._declared(kind)
        sev = severity or self.ctx.rule.severity
        vid = derived_id(self.ctx.rule.id, self.ctx.job_id, key, first_time)
        return [self._event(vid, kind, VerdictState.OPEN, sev, subject, first_time,
                            decided_time, evidence)]

    def retract(self, opened: Event, *, decided_time: int, reason: str) -> Event:
        """RESOLVED for a verdict the prompt lane opened early that the ordered evaluation did
        not confirm (e.g. an exit that turned out to be a stale replica's)."""
        v = opened.payload
        assert isinstance(v, Verdict)
        return self._event(v.verdict_id, v.kind, VerdictState.RESOLVED, v.severity,
                           opened.subject, v.first_anomalous_time, decided_time,
                           {"retracted": True, "reason": reason})

    def resolve(self, key: str, *, decided_time: int, evidence: Evidence) -> list[Event]:
        v = self.open.pop(key, None)
        if v is None:
            return []
        return [self._event(v.id, v.kind, VerdictState.RESOLVED, v.sev, v.subject, v.first,
                            decided_time, evidence)]

    def _declared(self, kind: VerdictKind) -> None:
        if kind not in self.kinds:
            raise ValueError(f"rule {self.ctx.rule.id}: verdict kind {kind.value} is not among "
                             f"the kinds its evaluator declares")

    def _event(self, vid: str, kind: VerdictKind, state: VerdictState, sev: Severity,
               subject: Subject, first_time: int, decided_time: int, evidence: Evidence) -> Event:
        payload = Verdict(verdict_id=vid, rule=self.ctx.rule.id, kind=kind, state=state,
                          severity=sev, first_anomalous_time=first_time,
                          decided_time=decided_time, evidence=evidence,
                          rules_version=self.ctx.rules_version)
        return make_event(payload, event_id=derived_id("verdict", vid, state.value),
                          job_id=self.ctx.job_id, event_time=decided_time, source=SOURCE,
                          subject=subject)


class RuleBase:
    """Common plumbing: context, verdict book and a JSON state dict ``self.s``.

    Subclasses keep every piece of mutable state in ``self.s`` (JSON types, string keys), so
    snapshot and restore are generic and cannot forget a field.
    """

    # class attributes (ClassVar: compiled subclasses keep them on the class, native.py)
    types: ClassVar[frozenset[str]] = frozenset()
    kinds: ClassVar[frozenset[VerdictKind]] = frozenset()  # every verdict kind it can open
    prompt_types: ClassVar[frozenset[str]] = frozenset()  # types ``prompt`` answers for

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.p = ctx.rule.params
        self.book = VerdictBook(ctx, self.kinds)
        self.s: dict[str, Any] = self.initial_state()

    def initial_state(self) -> dict[str, Any]:
        return {}

    def feed(self, event: Event) -> list[Event]:  # pragma: no cover - overridden
        raise NotImplementedError

    def rebind(self, rank: str, event: Event) -> list[Event]:
        """A new replica of ``rank`` (a higher binding epoch) showed itself with ``event``:
        forget the rank's per-rank state (the engine calls this before feeding the event)."""
        return []

    def prompt(self, event: Event) -> list[Event]:
        """The verdicts ``event`` will open when the ordered evaluation reaches it, if they can
        be told at its arrival; changes nothing. Only discrete per-subject rules that need no
        peers answer (``prompt_types``); the engine emits them at once and checks them later."""
        return []

    def snapshot(self) -> dict[str, Any]:
        """The live state, JSON-ready: serialise it before the next ``feed`` (the faust app
        does at once); copying it here would cost more than the evaluation itself."""
        return {"state": self.state_doc(), "open": self.book.doc()}

    def restore(self, state: dict[str, Any]) -> None:
        doc = orjson.loads(orjson.dumps(state))
        self.load_state(doc["state"])
        self.book.load(doc["open"])

    def state_doc(self) -> dict[str, Any]:
        """The rule's own state as JSON: ``self.s``, or a typed rule's ``doc()``."""
        return self.s

    def load_state(self, doc: dict[str, Any]) -> None:
        """Continue from a ``state_doc()`` (a fresh copy, the rule's to keep). A typed rule's
        ``from_doc`` gives keys missing from an older layout their initial values."""
        self.s = doc
        for key, value in self.initial_state().items():  # a snapshot from an older layout
            self.s.setdefault(key, value)
