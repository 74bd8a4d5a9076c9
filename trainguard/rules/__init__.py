"""Declarative rules and pure, deterministic evaluators (see docs/rules.md).

Public API: ``load_rules`` / ``load_default_rules`` / ``parse_rules`` -> ``RuleSet``;
``RuleEngine(job_id, ruleset, snapshot=None)`` with ``feed``, ``flush``, ``snapshot``,
``restore``; ``engine_factory(ruleset)`` for the streams app; ``replay`` for offline logs.

The hot modules run compiled when built (``native.py``); ``native.install`` first, so a stale
build, or ``TRAINGUARD_PURE=1``, runs them from their sources.
"""

from trainguard.rules import native

native.install()

from trainguard.rules.base import Evaluator  # noqa: E402
from trainguard.rules.engine import RuleEngine, engine_factory, replay  # noqa: E402
from trainguard.rules.schema import (  # noqa: E402
           RuleError,
           RuleSet,
           RuleSpec,
           load_default_rules,
           load_rules,
           parse_rules,
)

__all__ = ["Evaluator", "RuleEngine", "RuleError", "RuleSet", "RuleSpec", "engine_factory",
           "load_default_rules", "load_rules", "parse_rules", "replay"]
