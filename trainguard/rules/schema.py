"""Rule files: load, validate and normalise; the normalised set's hash is ``rules_version``.

A rule file is YAML (see docs/rules.md)::

    rules_version_label: "2026-12"      # optional, free text, not part of the hash
    allowed_lateness_ms: 2000
    rules:
      - id: straggler
        kind: straggler
        enabled: true
        severity: warning
        parameters: {threshold_ratio: 1.15}

Errors name the file, the rule and the field, e.g.
``default.yaml: rule 'straggler': field 'threshold_ratio': must be > 1 (got 0.9)``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from trainguard.configfile import ConfigFileError, finite_in, parse_yaml, read_text, show
from trainguard.events.payloads import Severity
from trainguard.rules.params import KINDS, LIMIT, NUM, PARAMS

if TYPE_CHECKING:
    from importlib.abc import Traversable  # importlib.resources.abc from 3.11

_ID = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
_RULE_KEYS = {"id", "kind", "enabled", "severity", "parameters", "description"}
_TOP_KEYS = {"rules", "allowed_lateness_ms", "rules_version_label"}


class RuleError(ValueError):
    """A rule file is invalid; ``problems`` lists every message."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class RuleSpec:
    id: str
    kind: str
    enabled: bool
    severity: Severity
    params: dict[str, Any]

    def normalised(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "enabled": self.enabled,
                "severity": self.severity.value, "parameters": dict(sorted(self.params.items()))}

    def digest(self) -> str:
        return hashlib.sha256(orjson.dumps(self.normalised())).hexdigest()[:16]


@dataclass(frozen=True)
class RuleSet:
    rules: tuple[RuleSpec, ...]
    allowed_lateness_us: int
    source: str = "<memory>"
    version: str = field(default="")

    def __post_init__(self) -> None:
        if not self.version:
            object.__setattr__(self, "version", rules_version(self))

    def enabled(self) -> tuple[RuleSpec, ...]:
        return tuple(r for r in self.rules if r.enabled)

    def get(self, rule_id: str) -> RuleSpec:
        for r in self.rules:
            if r.id == rule_id:
                return r
        raise KeyError(rule_id)


def rules_version(ruleset: RuleSet) -> str:
    """Hash of the normalised rule set (defaults filled, keys sorted, rules sorted by id)."""
    doc = {"allowed_lateness_us": ruleset.allowed_lateness_us,
           "rules": [r.normalised() for r in sorted(ruleset.rules, key=lambda r: r.id)]}
    return "rv-" + hashlib.sha256(orjson.dumps(doc)).hexdigest()[:16]


def _typename(kind: type | tuple[type, ...]) -> str:
    if kind == NUM:
        return "a number"
    name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
    return {"int": "an integer", "bool": "true or false", "str": "a string",
            "list": "a list"}.get(name, name)


def _check_value(value: Any, kind: type | tuple[type, ...]) -> bool:
    if isinstance(value, bool) and kind is not bool:
        return False
    return isinstance(value, kind)


def _in_range(value: Any, kind: type | tuple[type, ...]) -> bool:
    """Every number finite and of a size the evaluators can turn into microseconds and counts
    exactly (``floor_ms: .inf`` would pass ``> 0`` and overflow at run time)."""
    return kind not in (int, NUM) or finite_in(value, -LIMIT, LIMIT)


def _parse_rule(doc: Any, where: str, problems: list[str]) -> RuleSpec | None:
    if not isinstance(doc, dict):
        problems.append(f"{where}: must be a mapping (got {show(doc)})")
        return None
    rid = doc.get("id")
    if not isinstance(rid, str) or not _ID.fullmatch(rid):
        problems.append(f"{where}: field 'id': must match {_ID.pattern} (got {show(rid)})")
        return None
    here = f"{where.split(':')[0]}: rule '{rid}'"
    before = len(problems)
    for key in sorted(set(doc) - _RULE_KEYS):
        problems.append(f"{here}: field '{key}': unknown field")
    kind = doc.get("kind")
    if kind not in KINDS:
        problems.append(f"{here}: field 'kind': must be one of {', '.join(KINDS)} "
                        f"(got {show(kind)})")
        return None
    if not isinstance(doc.get("description", ""), str):
        problems.append(f"{here}: field 'description': must be a string "
                        f"(got {show(doc['description'])})")
    enabled = doc.get("enabled", True)
    if not isinstance(enabled, bool):
        problems.append(f"{here}: field 'enabled': must be true or false (got {show(enabled)})")
    sev_raw = doc.get("severity", "warning")
    try:
        severity = Severity(sev_raw)
    except (ValueError, TypeError):
        problems.append(f"{here}: field 'severity': must be one of info, warning, critical "
                        f"(got {show(sev_raw)})")
        severity = Severity.WARNING
    given = doc.get("parameters", {}) or {}
    if not isinstance(given, dict):
        problems.append(f"{here}: field 'parameters': must be a mapping (got {show(given)})")
        return None
    specs = {p.name: p for p in PARAMS[kind]}
    for key in sorted(map(str, set(given) - set(specs))):
        problems.append(f"{here}: field '{key}': unknown parameter for kind '{kind}' "
                        f"(known: {', '.join(specs)})")
    params: dict[str, Any] = {}
    for name, spec in specs.items():
        value = given.get(name, spec.default)
        if not _check_value(value, spec.kind):
            problems.append(f"{here}: field '{name}': must be {_typename(spec.kind)} "
                            f"(got {show(value)})")
            continue
        if not _in_range(value, spec.kind):
            problems.append(f"{here}: field '{name}': must be finite and within +-{LIMIT:g} "
                            f"(got {show(value)})")
            continue
        if spec.check is not None:
            msg = spec.check(value)
            if msg:
                problems.append(f"{here}: field '{name}': {msg} (got {show(value)})")
                continue
        params[name] = float(value) if spec.kind == NUM else value
    if "k" in params and "n" in params and params["k"] > params["n"]:
        problems.append(f"{here}: field 'k': must be <= n ({params['n']}) (got {params['k']})")
    for name in ("app_severity", "other_severity", "process_severity"):
        if name in params and params[name] not in {s.value for s in Severity}:
            problems.append(f"{here}: field '{name}': must be one of info, warning, critical "
                            f"(got {show(params[name])})")
    if len(problems) > before:
        return None
    return RuleSpec(rid, kind, bool(enabled), severity, params)


def parse_rules(text: str, name: str = "<memory>") -> RuleSet:
    """Parse and validate a rule file's text; ``name`` is used in error messages."""
    try:
        doc = parse_yaml(text, name)
    except ConfigFileError as exc:
        raise RuleError([str(exc)]) from None
    if not isinstance(doc, dict):
        raise RuleError([f"{name}: must be a mapping with a 'rules' list (got {show(doc)})"])
    problems: list[str] = [f"{name}: field '{k}': unknown top-level field"
                           for k in sorted(map(str, set(doc) - _TOP_KEYS))]
    lateness = doc.get("allowed_lateness_ms", 2000)
    if not finite_in(lateness, 0, LIMIT):
        problems.append(f"{name}: field 'allowed_lateness_ms': must be a number from 0 to "
                        f"{LIMIT:g} (got {show(lateness)})")
        lateness = 0
    label = doc.get("rules_version_label", "")
    if not isinstance(label, str | int | float):
        problems.append(f"{name}: field 'rules_version_label': must be text "
                        f"(got {show(label)})")
    raw_rules = doc.get("rules")
    if not isinstance(raw_rules, list):
        raise RuleError([*problems, f"{name}: field 'rules': must be a list "
                                    f"(got {show(raw_rules)})"])
    rules: list[RuleSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(raw_rules):
        spec = _parse_rule(item, f"{name}: rule #{i + 1}", problems)
        if spec is None:
            continue
        if spec.id in seen:
            problems.append(f"{name}: rule '{spec.id}': field 'id': duplicate rule id")
        seen.add(spec.id)
        rules.append(spec)
    if problems:
        raise RuleError(problems)
    return RuleSet(tuple(rules), round(float(lateness) * 1000), source=name)


def load_rules(path: str | Path) -> RuleSet:
    p = Path(path)
    try:
        text = read_text(p)
    except ConfigFileError as exc:
        raise RuleError([str(exc)]) from None
    return parse_rules(text, p.name)


DEFAULT_RULES = "default.yaml"


def default_rules_file() -> Traversable:
    """The shipped default rule set: in an installed wheel ``trainguard/rules/sets/`` (copied
    from the top-level ``rules/`` by setup.py's build step); in a source checkout or an
    editable install, ``rules/`` itself."""
    packaged = resources.files("trainguard.rules").joinpath("sets").joinpath(DEFAULT_RULES)
    if packaged.is_file():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "rules" / DEFAULT_RULES
    if checkout.is_file():
        return checkout
    raise RuleError([f"{DEFAULT_RULES}: the default rule set is missing (looked in "
                     f"{packaged} and {checkout})"])


def load_default_rules() -> RuleSet:
    text = default_rules_file().read_text("utf-8")
    return parse_rules(text, DEFAULT_RULES)
