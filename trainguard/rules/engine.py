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
watermark makes each job's verdicts independent of what other jobs share its partition. The
task and telemetry topics are lanes of it (``LANES``; see ``ordering.py``): a worker catching
up reads them in turns, and neither runs the watermark past the other's backlog.

Binding epochs (``epochs.py``): who holds which epoch comes only from verified ``pool.unit``
``bound`` events (the edge feeds the engine only those whose actuator signature verified);
between the buffer and the rules, reports, heartbeats and exits of an epoch older than the
rank's bound one are dropped (``stats()["stale"]``), and a binding at a higher epoch makes
every rule forget that rank's per-rank state. A report's own epoch never moves the binding.

Prompt lane (``prompt=True``, what the streams worker runs): a discrete critical signal - a
process exit, a must-drain XID, a link down - need not wait for the watermark, nor for the
backlog ahead of it on its topic: its urgent copy (``early``) comes on a topic of its own. On
its arrival the rules that need no peers say what it will open (``RuleBase.prompt``, no state
change) and the engine emits it at once. The ordered evaluation stays the only one that
changes state: when it reaches that event and opens the same verdict (same ``event_id``, same
bytes), the copy is suppressed; if it does not (an earlier exit of the rank, or a newer
replica, turned up within the lateness bound or in the backlog the copy overtook), the early
verdict is retracted (RESOLVED, ``evidence.retracted``). So the prompt output is the ordered
output with some events moved earlier (plus a rare retraction), and it is as deterministic:
the same arrivals give the same bytes, across restarts too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from trainguard.events.codec import decode_obj, encode
from trainguard.events.envelope import Event
from trainguard.events.payloads import PoolUnit, ProcessExit, UnitState, Verdict
from trainguard.events.registry import BY_NAME
from trainguard.events.topics import TopicRole
from trainguard.rules.base import Context, RuleBase
from trainguard.rules.epochs import EpochGate, Gate
from trainguard.rules.ordering import ReorderBuffer
from trainguard.rules.registry import EVALUATORS
from trainguard.rules.schema import RuleSet
from trainguard.streams.engine import EngineFactory

SNAPSHOT_VERSION = 1
# The topics the streams worker reads side by side for every job: each is a lane of the
# reorder buffer (``ordering.py``), so a catch-up that reads one ahead of the other drops
# nothing. A lane more than ``LANE_IDLE_US`` behind the newest event no longer holds the
# watermark. 10 s: a worker restarted behind up to that much backlog reads its inputs in turns
# without loss (the demo's worker starts ~5 s behind its job); and it is the longest a lane
# that stopped, or is sparse by nature (a node's kernel-log OOM kills and XIDs imported without
# its telemetry), delays the verdicts of the other: a longer bound protects longer restarts and
# holds every stopped or sparse lane that much longer.
# A lane not seen yet holds the others for ``LANE_EXPECT_US`` from a job's first event: a
# worker fetches its partitions together, so the first records of both inputs come within
# moments of each other; 5 s covers a slow first fetch, and is all a job without telemetry
# waits at its start.
# The backlog hold (``ordering.py``; the streams worker's default, ``--no-backlog-hold`` turns
# it off; ``RuleEngine`` and replay leave it off: replay feeds in event-time order).
# A record that waited ``BACKLOG_US`` or more in an agent's spool is a backlog (its agent was
# cut off from the broker); the watermark then stands still until the newest arrival is
# ``BACKLOG_HOLD_US`` past the last backlog record's (``ordering.py``, "Backlog hold"). 2 s:
# well above a live spool's hand-off (milliseconds; the agent writes no wait under 0.5 s) and
# a broker's leader election, well below any outage that would lose a node's records. 10 s:
# agents cut off together reconnect within their backoff (5 s at most) and drain a minute of
# records in about a second each; it is also how much longer a node that died during the
# outage waits for its silence verdict, and it dwarfs NTP-synchronised hosts' clock skew.
BACKLOG_US = 2_000_000
BACKLOG_HOLD_US = 10_000_000
LANES = (TopicRole.TASK, TopicRole.TELEMETRY)
LANE_IDLE_US = 10_000_000
LANE_EXPECT_US = 5_000_000
LANE_OF: dict[str, str] = {t.name: t.topic.value for t in BY_NAME.values() if t.topic in LANES}
# What the engine is fed: the task topic, the node telemetry, and the actuators' verified
# bindings (``pool.unit``: the edge feeds only those whose signature verified).
RULE_INPUTS = frozenset(LANE_OF) | EpochGate.types


class RuleEngine:
    """Feed one job's events in arrival order; get verdict events back."""

    def __init__(self, job_id: str, ruleset: RuleSet,
                 snapshot: dict[str, Any] | None = None, *, prompt: bool = False,
                 backlog_hold: bool = False) -> None:
        self.job_id = job_id
        self.ruleset = ruleset
        self.prompt = prompt
        self.buffer = ReorderBuffer(ruleset.allowed_lateness_us, LANE_IDLE_US,
                                    tuple(lane.value for lane in LANES), LANE_EXPECT_US,
                                    backlog_us=BACKLOG_US if backlog_hold else 0,
                                    hold_us=BACKLOG_HOLD_US)
        self.gate = EpochGate()
        self.rules: list[tuple[str, RuleBase]] = []
        self._digests = {spec.id: spec.digest() for spec in ruleset.rules}
        self._by_type: dict[str, list[RuleBase]] = {}
        self._prompters: dict[str, list[RuleBase]] = {}
        for spec in ruleset.enabled():
            rule = EVALUATORS[spec.kind](Context(job_id, ruleset.version, spec))
            self.rules.append((spec.id, rule))
            for t in sorted(rule.types):
                self._by_type.setdefault(t, []).append(rule)
            for t in sorted(rule.prompt_types):
                self._prompters.setdefault(t, []).append(rule)
        self._rule_by_id = dict(self.rules)
        # prompt lane: source event id -> verdicts emitted early, not yet confirmed;
        # verdict event id -> its source event id; rank -> newest epoch among arrivals
        self._early: dict[str, list[Event]] = {}
        self._early_ids: dict[str, str] = {}
        self._arrived_epoch: dict[str, int] = {}
        self.foreign = 0
        self.retracted = 0
        if snapshot is not None:
            self.restore(snapshot)

    def feed(self, event: Event, spooled_us: int = 0) -> list[Event]:
        """``spooled_us``: how long the record waited in an agent's spool (its header)."""
        if event.job_id != self.job_id:
            self.foreign += 1
            return []
        early: list[Event] = []
        if self.prompt and self.buffer.accepts(event):
            early = self._prompt(event)
        released = self.buffer.push(event, LANE_OF.get(event.type), spooled_us)
        if not released:
            return early
        out = self._evaluate(released)
        if self._early:
            out.extend(self._orphans())
        return early + out if early else out

    def early(self, event: Event) -> list[Event]:
        """An urgent copy (``registry.URGENT_TYPES``, read from the urgent topic): what the
        prompt lane opens on it, at once. The copy is never buffered: the ordered evaluation
        takes the original from its own topic, in event-time order, and confirms or retracts
        what this emitted, exactly as for an original that arrived first. A copy that comes
        after its original (buffered, evaluated or late) adds nothing."""
        if not self.prompt or event.job_id != self.job_id or not self.buffer.accepts(event):
            return []
        return self._prompt(event)

    def flush(self) -> list[Event]:
        """Release and evaluate everything buffered (end of an offline replay)."""
        out = self._evaluate(self.buffer.drain())
        return out + self._orphans(end=True) if self._early else out

    def _evaluate(self, events: Sequence[Event]) -> list[Event]:
        out: list[Event] = []
        by_type = self._by_type
        gate_types = self.gate.types
        early = self._early
        for ev in events:
            if ev.type in gate_types:
                verdict = self.gate.check(ev)
                if verdict is Gate.STALE:
                    if early and ev.event_id in early:
                        out.extend(self._retract(ev.event_id, ev.event_time, "stale binding epoch"))
                    continue
                if verdict is Gate.REBIND:
                    rank = str(ev.payload.rank)  # type: ignore[attr-defined]
                    for _, rule in self.rules:
                        out.extend(rule.rebind(rank, ev))
            for rule in by_type.get(ev.type, ()):
                got = rule.feed(ev)
                if got:
                    if self._early_ids:
                        got = self._confirm(got)
                    out.extend(got)
            if early and ev.event_id in early:
                out.extend(self._retract(ev.event_id, ev.event_time,
                                         "not confirmed in event-time order"))
        return out

    # --- the prompt lane ----------------------------------------------------------------

    def _prompt(self, event: Event) -> list[Event]:
        payload = event.payload
        kind = type(payload)
        if kind is PoolUnit:
            unit: PoolUnit = payload  # type: ignore[assignment]
            if unit.state is UnitState.BOUND and unit.rank is not None \
                    and unit.epoch is not None:
                rank = str(unit.rank)
                if unit.epoch > self._arrived_epoch.get(rank, -1):
                    self._arrived_epoch[rank] = unit.epoch
            return []
        rules = self._prompters.get(event.type)
        if not rules or event.event_id in self._early:
            return []
        if kind is ProcessExit and self._stale_exit(payload):  # type: ignore[arg-type]
            return []
        out: list[Event] = []
        for rule in rules:
            for v in rule.prompt(event):
                if v.event_id not in self._early_ids:
                    self._early_ids[v.event_id] = event.event_id
                    out.append(v)
        if out:
            self._early[event.event_id] = list(out)
        return out

    def _stale_exit(self, ex: ProcessExit) -> bool:
        """Might the ordered evaluation find this exit stale? Then it waits for it."""
        if ex.rank is None:
            return False
        rank = str(ex.rank)
        if ex.binding_epoch is None:
            entry = self.gate.ranks.get(rank)
            return entry is not None and ex.pid in entry.old
        known = [e for e in (self.gate.epoch(ex.rank), self._arrived_epoch.get(rank))
                 if e is not None]
        return bool(known) and ex.binding_epoch < max(known)

    def _confirm(self, got: list[Event]) -> list[Event]:
        """Drop the verdicts the prompt lane already emitted."""
        kept: list[Event] = []
        for v in got:
            source = self._early_ids.pop(v.event_id, None)
            if source is None:
                kept.append(v)
                continue
            pending = self._early[source]
            pending[:] = [e for e in pending if e.event_id != v.event_id]
        return kept

    def _orphans(self, *, end: bool = False) -> list[Event]:
        """Retract what an urgent copy opened when the watermark has passed its time (or the
        log has ended: ``end``) and no original came (lost, late, or a copy written alone):
        the ordered evaluation will never confirm it."""
        out: list[Event] = []
        wm = self.buffer.watermark
        for source, vs in list(self._early.items()):
            at = min((v.event_time for v in vs), default=wm)
            if end or at <= wm:
                out.extend(self._retract(source, at, "its event never came in event-time order"))
        return out

    def _retract(self, source_id: str, at: int, reason: str) -> list[Event]:
        """Retract the early verdicts of the event ``source_id``, decided at ``at``."""
        out: list[Event] = []
        for v in self._early.pop(source_id):
            self._early_ids.pop(v.event_id, None)
            payload = v.payload
            assert isinstance(payload, Verdict)
            rule = self._rule_by_id.get(payload.rule)
            if rule is not None:
                out.append(rule.book.retract(v, decided_time=at, reason=reason))
                self.retracted += 1
        return out

    @property
    def late(self) -> int:
        return self.buffer.late

    def stats(self) -> dict[str, int]:
        return {"late": self.buffer.late, "duplicates": self.buffer.duplicates,
                "buffered": len(self.buffer), "foreign": self.foreign,
                "watermark": self.buffer.watermark, "stale": self.gate.stale,
                "early_pending": len(self._early_ids), "retracted": self.retracted}

    def buffered_ids(self) -> set[str]:
        """Ids of the events waiting in the reorder buffer (a copy)."""
        return self.buffer.ids()

    def snapshot(self, *, events: bool = True) -> dict[str, Any]:
        """The whole state as JSON-ready data. It shares the live state: serialise it (e.g.
        ``orjson.dumps``) before feeding the next event. ``events=False`` leaves the buffered
        events out (their ids stay, see ``ReorderBuffer.snapshot``)."""
        return {"v": SNAPSHOT_VERSION, "job": self.job_id, "rules_version": self.ruleset.version,
                "buffer": self.buffer.snapshot(events=events), "foreign": self.foreign,
                "epochs": self.gate.snapshot(),
                "prompt": {"early": {src: [orjson.loads(encode(v)) for v in vs]
                                     for src, vs in self._early.items()},
                           "arrived": self._arrived_epoch, "retracted": self.retracted},
                "rules": {rid: {"digest": self._digests[rid],
                                "state": rule.snapshot()} for rid, rule in self.rules}}

    def restore(self, doc: dict[str, Any]) -> None:
        """Continue from a snapshot. A rule whose definition changed since starts afresh."""
        if doc.get("v") != SNAPSHOT_VERSION or doc.get("job") != self.job_id:
            raise ValueError(f"snapshot is not a v{SNAPSHOT_VERSION} snapshot of {self.job_id}")
        self.buffer.restore(doc["buffer"])
        self.foreign = int(doc.get("foreign", 0))
        if "epochs" in doc:  # absent from snapshots written before binding epochs
            self.gate.restore(doc["epochs"])
        prompt = doc.get("prompt") or {"early": {}, "arrived": {}, "retracted": 0}
        self._early = {src: [decode_obj(w) for w in ws] for src, ws in prompt["early"].items()}
        self._early_ids = {v.event_id: src for src, vs in self._early.items() for v in vs}
        self._arrived_epoch = {k: int(v) for k, v in prompt["arrived"].items()}
        self.retracted = int(prompt["retracted"])
        saved = doc["rules"]
        for rid, rule in self.rules:
            entry = saved.get(rid)
            if entry is not None and entry["digest"] == self._digests[rid]:
                rule.restore(entry["state"])


def engine_factory(ruleset: RuleSet, *, prompt: bool = False,
                   backlog_hold: bool = False) -> EngineFactory:
    """The streams app's ``EngineFactory``: (job id, saved snapshot or None) -> engine.
    ``prompt``: discrete critical signals are decided on arrival (see the module doc);
    ``backlog_hold``: the reorder buffer's backlog hold (``BACKLOG_US``; the streams CLI's
    default)."""

    def make(job_id: str, saved: dict[str, Any] | None) -> RuleEngine:
        return RuleEngine(job_id, ruleset, saved, prompt=prompt, backlog_hold=backlog_hold)

    return make


def replay(events: Iterable[Event], ruleset: RuleSet, job_id: str) -> list[Event]:
    """Offline: feed a job's log in the order given and drain at the end."""
    engine = RuleEngine(job_id, ruleset)
    out: list[Event] = []
    for ev in events:
        out.extend(engine.feed(ev))
    out.extend(engine.flush())
    return out
