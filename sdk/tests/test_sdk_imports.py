"""Every torch-free module imports on a bare interpreter (the SDK's test environments hold
only pytest and the SDK: a third-party import would fail here)."""

from __future__ import annotations

import importlib
import pkgutil

import trainguard_sdk

NEEDS_TORCH = {"trainguard_sdk.checkpoint.manager", "trainguard_sdk.checkpoint.sharded",
               "trainguard_sdk.ddp",
               # these import their framework (lightning, transformers) and torch
               "trainguard_sdk.integrations.lightning", "trainguard_sdk.integrations.hf"}


def test_every_torch_free_module_imports() -> None:
    names = [m.name for m in pkgutil.walk_packages(trainguard_sdk.__path__, "trainguard_sdk.")]
    assert "trainguard_sdk.wire" in names and "trainguard_sdk.checkpoint.store" in names
    for name in names:
        if name not in NEEDS_TORCH:
            importlib.import_module(name)


def test_every_module_compiles_on_this_python() -> None:
    """The torch modules too (they cannot be imported without torch): no syntax newer than
    the oldest supported Python."""
    from pathlib import Path

    root = Path(trainguard_sdk.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert root / "ddp.py" in files and root / "checkpoint" / "manager.py" in files
    for path in files:
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
