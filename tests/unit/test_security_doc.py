"""docs/security.md covers every topic of the registry, with the generated signer table."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.actuators.signing import render_trust_table
from trainguard.events.topics import TOPIC_SPECS, TopicNames

pytestmark = pytest.mark.unit

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def test_the_trust_table_is_current() -> None:
    text = DOC.read_text()
    begin, end = "<!-- trust-table:begin -->\n", "\n<!-- trust-table:end -->"
    table = text[text.index(begin) + len(begin):text.index(end)]
    assert table == render_trust_table(), (
        "docs/security.md is stale: paste trainguard.actuators.signing.render_trust_table()")


def test_every_topic_has_a_row_in_what_each_service_believes() -> None:
    text = DOC.read_text()
    section = text[text.index("## What each service believes"):text.index("## Keys")]
    attacker = text[text.index("## An attacker"):]
    for spec in TOPIC_SPECS:
        name = f"| `{TopicNames().name(spec.role)}` |"
        assert name in section, name
        assert name in attacker, name
