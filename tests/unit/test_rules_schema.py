"""Rule files: the shipped default loads; bad files are refused naming file, rule, field."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.rules.schema import RuleError, load_default_rules, load_rules, parse_rules

pytestmark = pytest.mark.unit


def test_default_rules_load_and_cover_every_kind() -> None:
    rs = load_default_rules()
    from trainguard.rules.params import KINDS

    assert {r.kind for r in rs.rules} == set(KINDS)
    assert rs.version.startswith("rv-")
    assert rs.get("straggler").params["threshold_ratio"] == 1.15


def test_error_names_file_rule_and_field(tmp_path: Path) -> None:
    path = tmp_path / "default.yaml"
    path.write_text("rules:\n  - id: straggler\n    kind: straggler\n"
                    "    parameters: {threshold_ratio: 0.9}\n")
    with pytest.raises(RuleError) as err:
        load_rules(path)
    assert str(err.value) == (
        "default.yaml: rule 'straggler': field 'threshold_ratio': must be > 1 (got 0.9)")


@pytest.mark.parametrize(("body", "expected"), [
    ("  - id: s\n    kind: nope\n", "rule 's': field 'kind': must be one of"),
    ("  - id: s\n    kind: straggler\n    severity: loud\n", "field 'severity'"),
    ("  - id: s\n    kind: straggler\n    parameters: {bogus: 1}\n",
     "field 'bogus': unknown parameter"),
    ("  - id: s\n    kind: straggler\n    parameters: {k: 9, n: 5}\n", "field 'k': must be <= n"),
    ("  - id: s\n    kind: straggler\n    parameters: {min_peers: two}\n",
     "field 'min_peers': must be an integer (got 'two')"),
    ("  - id: s\n    kind: xid\n    parameters: {drain_codes: [a]}\n",
     "field 'drain_codes': must be a list of integers"),
    ("  - id: s\n    kind: straggler\n  - id: s\n    kind: liveness\n", "duplicate rule id"),
    ("  - id: Bad Id\n    kind: straggler\n", "field 'id'"),
])
def test_invalid_rules_are_refused(body: str, expected: str) -> None:
    with pytest.raises(RuleError) as err:
        parse_rules("rules:\n" + body, "f.yaml")
    assert expected in str(err.value)
    assert str(err.value).startswith("f.yaml: ")


def test_every_problem_is_reported_at_once() -> None:
    text = ("rules:\n  - id: a\n    kind: straggler\n    parameters: {threshold_ratio: 0.5}\n"
            "  - id: b\n    kind: liveness\n    parameters: {floor_ms: -1}\n")
    with pytest.raises(RuleError) as err:
        parse_rules(text, "f.yaml")
    assert len(err.value.problems) == 2


def test_rules_version_is_the_normalised_content() -> None:
    a = parse_rules("rules:\n  - id: s\n    kind: straggler\n")
    b = parse_rules("rules:\n  - id: s\n    kind: straggler\n    enabled: true\n"
                    "    parameters: {threshold_ratio: 1.15}\n")
    c = parse_rules("rules:\n  - id: s\n    kind: straggler\n    parameters: {k: 2}\n")
    assert a.version == b.version != c.version
