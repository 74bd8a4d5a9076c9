"""The rule engine of one job: reorder buffer (watermark) + the enabled rules.

How a faust agent uses it (see trainguard/streams/app.py)::

    factory = engine_factory(load_default_rules())
    engine = factory(job_id, saved_snapshot_or_None)   # RuleEngine
    for verdict in engine.feed(event): ...             # verdict events, in decision order
    table[job_id] = orjson.dumps(engine.snapshot())    # plain JSON

Offline replay: ``replay(events, ruleset, job_id)`` feeds a log and drains the buffer at the
end. The same log gives the same verdict sequence (``encode``-identical) whatever the arrival
interleaving within ``allowed_lateness_ms``, with duplicates, and across snapshot/restore.
The watermark is kept per job: a job's events all live in one partition, and a per-job
watermark makes each job's verdicts independent of what other jobs share its partition.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from trainguard.events.envelope import Event
from trainguard.rules.base import Context, RuleBase
from trainguard.rules.ordering import ReorderBuffer
from trainguard.rules.registry import EVALUATORS
from trainguard.rules.schema import RuleSet
from trainguard.streams.engine import EngineFactory

SNAPSHOT_VERSION = 1


class RuleEngine:
    """Feed one job's events in arrival order; get verdict events back."""

    def __init__(self, job_id: str, ruleset: RuleSet,
                 snapshot: dict[str, Any] | None = None) -> None:
        self.job_id = job_id
        self.ruleset = ruleset
        self.buffer = ReorderBuffer(ruleset.allowed_lateness_us)
        self.rules: list[tuple[str, RuleBase]] = []
        self._digests = {spec.id: spec.digest() for spec in ruleset.rules}
        self._by_type: dict[str, list[RuleBase]] = {}
        for spec in ruleset.enabled():
            rule = EVALUATORS[spec.kind](Context(job_id, ruleset.version, spec))
            self.rules.append((spec.id, rule))
            for t in sorted(rule.types):
                self._by_type.setdefault(t, []).append(rule)
        self.foreign = 0
        if snapshot is not None:
            self.restore(snapshot)

    def feed(self, event: Event) -> list[Event]:
        if event.job_id != self.job_id:
            self.foreign += 1
            return []
        released = self.buffer.push(event)
        return self._evaluate(released) if released else []

    def flush(self) -> list[Event]:
        """Release and evaluate everything buffered (end of an offline replay)."""
        return self._evaluate(self.buffer.drain())

    def _evaluate(self, events: Sequence[Event]) -> list[Event]:
        out: list[Event] = []
        by_type = self._by_type
        for ev in events:
            for rule in by_type.get(ev.type, ()):
                got = rule.feed(ev)
                if got:
                    out.extend(got)
        return out

    @property
    def late(self) -> int:
        return self.buffer.late

    def stats(self) -> dict[str, int]:
        return {"late": self.buffer.late, "duplicates": self.buffer.duplicates,
                "buffered": len(self.buffer), "foreign": self.foreign,
                "watermark": self.buffer.watermark}

    def snapshot(self) -> dict[str, Any]:
        """The whole state as JSON-ready data. It shares the live state: serialise it (e.g.
        ``orjson.dumps``) before feeding the next event."""
        return {"v": SNAPSHOT_VERSION, "job": self.job_id, "rules_version": self.ruleset.version,
                "buffer": self.buffer.snapshot(), "foreign": self.foreign,
                "rules": {rid: {"digest": self._digests[rid],
                                "state": rule.snapshot()} for rid, rule in self.rules}}

    def restore(self, doc: dict[str, Any]) -> None:
        """Continue from a snapshot. A rule whose definition changed since starts afresh."""
        if doc.get("v") != SNAPSHOT_VERSION or doc.get("job") != self.job_id:
            raise ValueError(f"snapshot is not a v{SNAPSHOT_VERSION} snapshot of {self.job_id}")
        self.buffer.restore(doc["buffer"])
        self.foreign = int(doc.get("foreign", 0))
        saved = doc["rules"]
        for rid, rule in self.rules:
            entry = saved.get(rid)
            if entry is not None and entry["digest"] == self._digests[rid]:
                rule.restore(entry["state"])


def engine_factory(ruleset: RuleSet) -> EngineFactory:
    """The streams app's ``EngineFactory``: (job id, saved snapshot or None) -> engine."""

    def make(job_id: str, saved: dict[str, Any] | None) -> RuleEngine:
        return RuleEngine(job_id, ruleset, saved)

    return make


def replay(events: Iterable[Event], ruleset: RuleSet, job_id: str) -> list[Event]:
    """Offline: feed a job's log in the order given and drain at the end."""
    engine = RuleEngine(job_id, ruleset)
    out: list[Event] = []
    for ev in events:
        out.extend(engine.feed(ev))
    out.extend(engine.flush())
    return out
