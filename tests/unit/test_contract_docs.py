from __future__ import annotations

from pathlib import Path

from trainguard.events.docs import render_markdown
from trainguard.events.registry import EVENT_TYPES

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"


def test_docs_events_md_is_the_rendered_registry() -> None:
    assert DOC.read_text() == render_markdown(), (
        "docs/events.md is stale: run `trainguard events schema --out docs/events.md`")


def test_every_type_and_every_payload_field_is_documented() -> None:
    text = DOC.read_text()
    for spec in EVENT_TYPES:
        assert f"`{spec.name}`" in text
        for field in spec.payload.model_fields:
            assert f"`{field}`" in text
