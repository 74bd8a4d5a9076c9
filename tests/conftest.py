"""Test tiers by folder: tests/unit (pure), tests/integration (real broker and real system
parts), tests/drill (fault drills). `./tg test` runs each tier with `-m <tier>`."""

from __future__ import annotations

import pytest

TIERS = ("unit", "integration", "drill")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = item.path.parts
        for tier in TIERS:
            if tier in parts and "tests" in parts:
                item.add_marker(getattr(pytest.mark, tier))
