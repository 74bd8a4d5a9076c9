"""Run the rules with the straggler as it was before issue 14, for before/after figures in one
run: the legacy evaluator is swapped into the registry and given its old parameters."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager

from bench.legacy_straggler import LegacyStragglerRule
from bench.main_straggler import MainStragglerRule
from trainguard.rules import RuleSet
from trainguard.rules.registry import EVALUATORS

# the old defaults (params.py and default.yaml at d7da321)
LEGACY_PARAMS = {
    "threshold_ratio": 1.18, "window_steps": 3, "k": 3, "n": 5, "close_lag_steps": 2,
    "min_peers": 3, "min_excess_ms": 5.0, "warmup_steps": 10, "baseline_steps": 20,
    "baseline_max_ratio": 1.12, "resolve_ratio": 1.05, "resolve_windows": 5,
    "burst_ratio": 2.0, "burst_min_excess_ms": 10.0, "burst_steps": 20, "burst_k": 4,
    "burst_resolve_max": 1,
}


def legacy_ruleset(rules: RuleSet) -> RuleSet:
    """``rules`` with every straggler rule given the old parameters."""
    specs = tuple(dataclasses.replace(r, params=dict(LEGACY_PARAMS)) if r.kind == "straggler"
                  else r for r in rules.rules)
    return RuleSet(specs, rules.allowed_lateness_us, rules.source + " (legacy straggler)")


@contextmanager
def legacy_straggler() -> Iterator[None]:
    """While inside, the registry builds the old straggler evaluator."""
    new = EVALUATORS["straggler"]
    EVALUATORS["straggler"] = LegacyStragglerRule
    try:
        yield
    finally:
        EVALUATORS["straggler"] = new


@contextmanager
def main_straggler() -> Iterator[None]:
    """While inside, the registry builds the straggler rule as it was on main before the
    replay-rate work (same parameters, same output)."""
    new = EVALUATORS["straggler"]
    EVALUATORS["straggler"] = MainStragglerRule
    try:
        yield
    finally:
        EVALUATORS["straggler"] = new
