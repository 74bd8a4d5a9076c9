"""Shared by the rules tests: the default rule set, a time axis, replay and verdict kinds."""

from __future__ import annotations

from trainguard.events.envelope import Event
from trainguard.events.payloads import Verdict
from trainguard.rules import load_default_rules, replay

RULES = load_default_rules()
T0 = 1_700_000_000_000_000
S = 1_000_000


def run(events: list[Event]) -> list[Event]:
    return replay(sorted(events, key=lambda e: (e.event_time, e.event_id)), RULES, "j")


def kinds(out: list[Event]) -> list[tuple[str, str]]:
    return [(v.payload.kind, v.payload.state.value) for v in out if isinstance(v.payload, Verdict)]
