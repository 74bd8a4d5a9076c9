"""The rules, compiled: which modules mypyc compiles, and the guard against a stale build.

The rule evaluators and the engine are plain, typed Python; mypyc compiles them to C
extensions (``MODULES``; setup.py builds them with ``TRAINGUARD_NATIVE=1``, ``./tg setup`` does
it in place whenever a source changed). Compiled or not, they are the same code and give the
same verdicts, byte for byte (tests/unit/test_native.py); compiled, the offline replay runs
about twice as fast (``python -m bench.bench_rules``).

A build writes ``_native.json`` beside the modules: the extension suffix it was built for and
each source's SHA-256. Python imports an extension before the ``.py`` of the same name, so a
source edited after the build would silently run as it was. ``install`` (first thing in
``trainguard.rules``) therefore checks the digests: if any compiled source changed since, or
``TRAINGUARD_PURE=1`` is set, every module of ``MODULES`` is imported from its ``.py`` (all of
them: compiled modules call each other directly, so a mix would still run the old code), with
a one-line warning for a stale build. Other Pythons than the build's never load its
extensions and need nothing.

Standard library only: setup.py and ``./tg`` run this file by path, before trainguard's
dependencies exist (``python trainguard/rules/native.py --fresh``: exit 0 when the in-place
build matches the sources, 1 when it must be built).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from pathlib import Path
from types import ModuleType

PACKAGE = "trainguard.rules"
# The hot path of a replay and of the streams worker: the engine, its buffer and gate, and
# every evaluator. Not compiled: the package itself, this file, the rule-set schema and
# parameters (read once), the registry, the synthetic generators, and ``base`` (the bench's
# older straggler rules subclass RuleBase from interpreted code).
MODULES = ("engine", "ordering", "epochs", "steps", "stats", "straggler", "slowdown",
           "liveness", "sections", "oom", "starvation", "training", "outlier", "xid", "link",
           "gpu_health", "external")
GROUP = f"{PACKAGE}._native"  # the shared library mypyc builds for them all
HERE = Path(__file__).resolve().parent
STAMP = HERE / "_native.json"
PURE_ENV = "TRAINGUARD_PURE"


def sources(root: Path = HERE) -> list[Path]:
    return [root / f"{m}.py" for m in MODULES]


def digests(root: Path = HERE) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sources(root)}


def ext_suffix() -> str:
    return importlib.machinery.EXTENSION_SUFFIXES[0]


def write_stamp(root: Path, src: Path | None = None) -> Path:
    """After a build: what it was built for, and from which sources (``src``, default
    ``root``: the folder the build read them from)."""
    path = root / STAMP.name
    path.write_text(json.dumps({"ext_suffix": ext_suffix(), "sources": digests(src or root)},
                               indent=1, sort_keys=True) + "\n")
    return path


def read_stamp(path: Path = STAMP) -> dict[str, object] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def built_here(root: Path = HERE) -> dict[str, object] | None:
    """The stamp of a build for this Python, else None (none, unreadable, or another's)."""
    stamp = read_stamp(root / STAMP.name)
    return stamp if stamp is not None and stamp.get("ext_suffix") == ext_suffix() else None


def changed(stamp: dict[str, object], now: dict[str, str]) -> list[str]:
    """The compiled sources whose digest differs from the build's (or that it did not build)."""
    built = stamp.get("sources")
    built = built if isinstance(built, dict) else {}
    return sorted(name for name, digest in now.items() if built.get(name) != digest)


class PureFinder(MetaPathFinder):
    """Imports ``MODULES`` from their ``.py`` files, never their extensions."""

    def __init__(self, root: Path = HERE) -> None:
        self.root = root
        self.names = {f"{PACKAGE}.{m}" for m in MODULES}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.names:
            return None
        return importlib.util.spec_from_file_location(
            fullname, self.root / f"{fullname.rsplit('.', 1)[1]}.py")


def forced_pure() -> bool:
    """Whether ``install`` made this process import the sources."""
    return any(isinstance(f, PureFinder) for f in sys.meta_path)


def mode(root: Path = HERE) -> str:
    """How the rules run in this process, in words (benches print it)."""
    if forced_pure():
        why = "TRAINGUARD_PURE=1" if os.environ.get(PURE_ENV) == "1" else "stale build"
        return f"pure Python ({why})"
    if built_here(root) is None:
        return "pure Python (not compiled for this Python: ./tg setup compiles it)"
    return f"compiled (mypyc, {len(MODULES)} modules)"


def install() -> None:
    """Run the pure sources when asked to, or when the build is stale (see the module doc)."""
    if forced_pure():
        return
    if os.environ.get(PURE_ENV) == "1":
        sys.meta_path.insert(0, PureFinder())
        return
    stamp = built_here()
    if stamp is None:
        return
    stale = changed(stamp, digests())
    if stale:
        warnings.warn(f"{PACKAGE}: {', '.join(stale)} changed since the rules were compiled; "
                      "running them as pure Python (./tg setup compiles them again)",
                      RuntimeWarning, stacklevel=2)
        sys.meta_path.insert(0, PureFinder())


def fresh(root: Path = HERE) -> bool:
    """Whether the in-place build matches the sources, for this Python."""
    stamp = built_here(root)
    return (stamp is not None
            and all((root / f"{m}{ext_suffix()}").exists() for m in MODULES)
            and not changed(stamp, digests(root)))


if __name__ == "__main__":
    if sys.argv[1:] != ["--fresh"]:
        sys.exit(f"usage: python {sys.argv[0]} --fresh")
    sys.exit(0 if fresh() else 1)
