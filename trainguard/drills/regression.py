"""Regression across runs: which conclusions changed since the previous run."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path


def conclusions(run_dir: Path) -> dict[str, str | None]:
    try:
        meta = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    return {name: s.get("conclusion") for name, s in meta.get("scenarios", {}).items()}


def diff(before: Mapping[str, str | None], after: Mapping[str, str | None]) -> list[str]:
    """One line per scenario of ``after`` whose conclusion differs from ``before``. Pure."""
    out = []
    for name, now in sorted(after.items()):
        if name not in before:
            out.append(f"{name}: new ({now})")
        elif before[name] != now:
            out.append(f"{name}: {before[name]} -> {now}")
    return out


def changed_since_last(root: Path, run_dir: Path) -> list[str]:
    runs = sorted(p for p in root.iterdir() if (p / "run.json").exists()
                  and p.name != run_dir.name and p.name < run_dir.name) \
        if root.is_dir() else []
    if not runs:
        return ["no earlier run to compare with"]
    prev = runs[-1]
    now = conclusions(run_dir)
    before = conclusions(prev)
    changed = diff({k: v for k, v in before.items() if k in now}, now)
    same = sorted(k for k in now if k in before and before[k] == now[k])
    return [f"since run {prev.name}: " + (", ".join(changed) if changed else
                                            "no conclusion changed")
            + (f"; unchanged: {', '.join(same)}" if same else "")]
