"""Pick a renderer by name."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from trainguard.timeline.model import Timeline
from trainguard.timeline.render_html import render_html
from trainguard.timeline.render_md import render_markdown
from trainguard.timeline.render_text import render_text


def render_json(tl: Timeline) -> str:
    return orjson.dumps(tl.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() \
        + "\n"


FORMATS: dict[str, Callable[[Timeline], str]] = {
    "text": render_text, "json": render_json, "md": render_markdown, "html": render_html}


def render(tl: Timeline, fmt: str) -> str:
    try:
        return FORMATS[fmt](tl)
    except KeyError:
        raise ValueError(f"format: must be one of {', '.join(FORMATS)} (got {fmt!r})") from None
