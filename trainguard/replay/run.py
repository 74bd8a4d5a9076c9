"""Replay one recorded log: the rules again over the streams' inputs, the incident fold again
over the replayed verdicts and the recorded decisions, both compared with the recording."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainguard.bus.consumer import Check
from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentTransition, Verdict, VerdictState
from trainguard.events.registry import SIGNED_TYPES
from trainguard.incidents.aggregate import incident_id, rebuild
from trainguard.incidents.settings import IncidentSettings
from trainguard.incidents.source import order
from trainguard.replay.diff import IncidentDiff, VerdictDiff, diff_incidents, diff_verdicts
from trainguard.replay.window import Window
from trainguard.rules import RuleEngine, RuleSet
from trainguard.rules.engine import RULE_INPUTS


@dataclass
class ReplayResult:
    rules_version: str
    recorded_rules_versions: list[str]
    window: Window
    verdicts: VerdictDiff
    incidents: IncidentDiff
    recorded_verdicts: list[Event]
    replayed_verdicts: list[Event]
    replayed_transitions: list[Event]
    incidents_recorded: bool  # False: the log had no transitions; compared with a rebuild
    retracted: int = 0  # prompt-lane verdicts retracted live, left out of the comparison
    verdicts_recorded: bool = True  # False: the whole log holds no verdict (e.g. imported)

    @property
    def mode(self) -> str:
        """``reproduce``: the recording's rules again; ``what_if_rules``: other rules than the
        recording's; ``what_if_unrecorded``: the log records no verdicts (an imported history,
        or one no rules ran on), so there is nothing to reproduce: what the rules find."""
        if not self.verdicts_recorded:
            return "what_if_unrecorded"
        if self.recorded_rules_versions and self.recorded_rules_versions != [self.rules_version]:
            return "what_if_rules"
        return "reproduce"

    @property
    def what_if(self) -> bool:
        return self.mode != "reproduce"

    @property
    def exit_code(self) -> int:
        """0: reproduced exactly, or a what-if run; 1: the recording's own rules decided
        differently (a failed reproduction)."""
        return 0 if self.what_if or self.exact else 1

    @property
    def exact(self) -> bool:
        return self.verdicts.exact and self.incidents.exact


def retracted_verdicts(log: Sequence[Event]) -> set[str]:
    """Verdicts the live worker's prompt lane emitted early and then retracted (a RESOLVED
    with ``evidence.retracted``): they depend on the live arrival order, which a log does not
    keep, so both sides leave them (and incidents they opened) out of the comparison."""
    return {e.payload.verdict_id for e in log if isinstance(e.payload, Verdict)
            and e.payload.state is VerdictState.RESOLVED
            and e.payload.evidence.get("retracted") is True}


def rerun_rules(events: Sequence[Event], ruleset: RuleSet, until: int | None,
                check: Check | None = None, *, flush: bool = False) -> list[Event]:
    """Verdicts as the live worker decides them: every job's inputs in event-time order (a
    valid arrival order), no flush at the end (the live worker never flushes). Records of a
    signed type (the actuators' bindings) are fed only when ``check`` verifies them, as the
    live worker does; without ``check`` none is. ``flush``: the history is finished (a log
    with no recorded verdicts, e.g. imported): each job's buffered tail is evaluated too, so a
    fault's end at the very end of a job's events still counts."""
    limit = None if until is None else until + ruleset.allowed_lateness_us
    engines: dict[str, RuleEngine] = {}
    out: list[Event] = []
    for ev in events:
        if ev.type not in RULE_INPUTS or (limit is not None and ev.event_time > limit):
            continue
        if ev.type in SIGNED_TYPES and (check is None or check(ev) is not None):
            continue
        engine = engines.get(ev.job_id)
        if engine is None:
            engine = engines[ev.job_id] = RuleEngine(ev.job_id, ruleset)
        out += engine.feed(ev)
    if flush:
        for job in sorted(engines):
            out += engines[job].flush()
    return out


def replay_log(events: Sequence[Event], ruleset: RuleSet, window: Window | None = None,
               settings: IncidentSettings | None = None,
               check: Check | None = None) -> ReplayResult:
    window = window or Window()
    log = order(events)
    retracted = retracted_verdicts(log)
    recorded_v = [e for e in log if isinstance(e.payload, Verdict)
                  and e.payload.verdict_id not in retracted]
    replayed_v = rerun_rules(log, ruleset, window.end, check, flush=not recorded_v)
    decisions = [e for e in log if not isinstance(e.payload, (Verdict, IncidentTransition))]
    replayed_t = rebuild(decisions + replayed_v, settings)
    left_out = {incident_id(e.job_id, vid) for e in log if isinstance(e.payload, Verdict)
                for vid in [e.payload.verdict_id] if vid in retracted}
    recorded_t = [e for e in log if isinstance(e.payload, IncidentTransition)
                  and e.payload.incident_id not in left_out]
    incidents_recorded = bool(recorded_t)
    if not incidents_recorded:
        recorded_t = rebuild(decisions + recorded_v, settings)
    versions = sorted({e.payload.rules_version for e in recorded_v
                       if isinstance(e.payload, Verdict) and e.payload.rules_version})

    what_if = bool(versions) and versions != [ruleset.version]

    def inside(evs: list[Event]) -> list[Event]:
        return [e for e in evs if window.contains(e.event_time)]

    return ReplayResult(
        rules_version=ruleset.version, recorded_rules_versions=versions, window=window,
        verdicts=diff_verdicts(inside(recorded_v), inside(replayed_v), ignore_version=what_if),
        incidents=diff_incidents(inside(recorded_t), inside(replayed_t),
                                 (settings or IncidentSettings()).join_window_us),
        recorded_verdicts=inside(recorded_v), replayed_verdicts=inside(replayed_v),
        replayed_transitions=inside(replayed_t), incidents_recorded=incidents_recorded,
        retracted=len(retracted), verdicts_recorded=bool(recorded_v))
