"""Every third-party module the code imports (at any depth: lazy imports too) is declared:
trainguard's by its distribution's requirements (the extras included), and the SDK, which goes
into training images, imports only the standard library and the frameworks it uses when present.
Import names map to distributions through each installed distribution's files (what
``packages_distributions`` reads from Python 3.11 on; 3.10's reads only ``top_level.txt``, which
modern wheels lack); an import no installed distribution provides (torch in a venv without the
workload extra) counts as declared when a requirement has its very name."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY = {"trainguard", "trainguard_sdk"}
# The SDK's optional frameworks: imported only when the trainer has them (numpy: the RNG state
# of a trainer that used it).
SDK_OPTIONAL = {"torch", "lightning", "transformers", "numpy"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def third_party_imports(package: Path) -> dict[str, str]:
    """Top-level name -> the first file importing it, for every absolute import under
    ``package`` that is neither the standard library nor first-party."""
    found: dict[str, str] = {}
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in FIRST_PARTY:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def declared(dist: str) -> set[str]:
    """The distributions ``dist`` requires, its extras' included (normalized names)."""
    out = set()
    for req in md.requires(dist) or []:
        name = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        assert name, f"{dist}: unreadable requirement {req!r}"
        out.add(normalize(name[1]))
    return out


def module_distributions() -> dict[str, set[str]]:
    """Top-level import name -> the (normalized) distributions installing it."""
    out: dict[str, set[str]] = {}
    for dist in md.distributions():
        name = normalize(dist.metadata["Name"] or "")
        tops = set((dist.read_text("top_level.txt") or "").split())
        for f in dist.files or []:
            first = f.parts[0] if f.parts else ""
            if first.endswith((".dist-info", ".egg-info", ".data")) or first in ("..", ""):
                continue
            tops.add(first[:-3] if first.endswith(".py") else first.split(".")[0])
        for top in tops:
            out.setdefault(top, set()).add(name)
    return out


def undeclared(imports: dict[str, str], wanted: set[str]) -> list[str]:
    by_module = module_distributions()
    out = []
    for top, where in sorted(imports.items()):
        dists = by_module.get(top) or {normalize(top)}  # not installed: its own name
        if not dists & wanted:
            source = sorted(dists)
            out.append(f"{where}: imports {top} (from {source}), not declared in "
                       f"{sorted(wanted)}")
    return out


def test_the_scan_finds_imports_and_the_mapping_knows_them() -> None:
    found = third_party_imports(ROOT / "trainguard")
    assert {"pydantic", "yaml", "aiokafka", "faust"} <= found.keys(), found
    assert "os" not in found and "trainguard" not in found
    assert undeclared({"yaml": "x.py"}, {"pyyaml"}) == []  # import name != distribution name
    assert undeclared({"yaml": "x.py"}, {"pydantic"})  # and a miss is reported
    assert undeclared({"nosuchmodule": "x.py"}, {"nosuchmodule"}) == []  # by its own name
    assert undeclared({"nosuchmodule": "x.py"}, {"pydantic"})


def test_every_import_of_the_service_is_declared() -> None:
    problems = undeclared(third_party_imports(ROOT / "trainguard"), declared("trainguard"))
    assert not problems, "\n".join(problems)


def test_the_sdk_imports_only_the_standard_library_and_its_optional_frameworks() -> None:
    found = third_party_imports(ROOT / "sdk" / "trainguard_sdk")
    assert found.keys() <= SDK_OPTIONAL, {k: v for k, v in found.items()
                                          if k not in SDK_OPTIONAL}
    assert declared("trainguard-sdk") == set()  # pip install ./sdk installs nothing else
