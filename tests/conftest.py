"""Test tiers by folder: tests/unit (pure), tests/integration (real broker and real system
parts), tests/drill (fault drills). `./tg test` runs each tier with `-m <tier>`."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from hypothesis import settings

# Deadlines are timing assertions, and this machine (and CI's) is shared and noisy: a property
# test fails on what it finds, never on how long one example took. Tests may still set theirs.
settings.register_profile("trainguard", deadline=None)
settings.load_profile("trainguard")

TIERS = ("unit", "integration", "drill")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("cluster") is not None:
            continue  # the Slurm cluster's drills: run by name (-m cluster), in no tier yet
        parts = item.path.parts
        for tier in TIERS:
            if tier in parts and "tests" in parts:
                item.add_marker(getattr(pytest.mark, tier))


# The services run on Python 3.10-3.13; `./tg test` also runs the unit tier on another Python
# in a venv without the `workload` extra (torch is gigabytes). There, the modules that import
# torch (directly or through the reference workload) at module level are left out, and the
# run says how many.
_NEEDS_TORCH = re.compile(r"^(import torch|from torch[. ]|from trainguard\.workload[. ])", re.M)
_HAS_TORCH = importlib.util.find_spec("torch") is not None
_LEFT_OUT: list[str] = []


def pytest_ignore_collect(collection_path: Path) -> bool | None:
    if _HAS_TORCH or collection_path.suffix != ".py" or not collection_path.name.startswith(
            "test_"):
        return None
    if _NEEDS_TORCH.search(collection_path.read_text(encoding="utf-8")):
        _LEFT_OUT.append(collection_path.name)
        return True
    return None


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _LEFT_OUT:
        terminalreporter.write_line(
            f"left out without torch (the workload extra is not installed): "
            f"{len(_LEFT_OUT)} modules: {', '.join(sorted(_LEFT_OUT))}")
