"""Every third-party module the code imports (at any depth: lazy imports too) is declared:
trainguard's by its distribution's requirements (the extras included), and the SDK, which goes
into training images, imports only the standard library and the frameworks it uses when present.
Import names map to distributions through ``importlib.metadata.packages_distributions``."""

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


def undeclared(imports: dict[str, str], wanted: set[str]) -> list[str]:
    by_module = md.packages_distributions()
    out = []
    for top, where in sorted(imports.items()):
        dists = {normalize(d) for d in by_module.get(top, [])}
        if not dists & wanted:
            source = sorted(dists) or "no installed distribution"
            out.append(f"{where}: imports {top} (from {source}), not declared in "
                       f"{sorted(wanted)}")
    return out


def test_the_scan_finds_imports_and_the_mapping_knows_them() -> None:
    found = third_party_imports(ROOT / "trainguard")
    assert {"pydantic", "yaml", "aiokafka", "faust"} <= found.keys(), found
    assert "os" not in found and "trainguard" not in found
    assert undeclared({"yaml": "x.py"}, {"pyyaml"}) == []  # import name != distribution name
    assert undeclared({"yaml": "x.py"}, {"pydantic"})  # and a miss is reported


def test_every_import_of_the_service_is_declared() -> None:
    problems = undeclared(third_party_imports(ROOT / "trainguard"), declared("trainguard"))
    assert not problems, "\n".join(problems)


def test_the_sdk_imports_only_the_standard_library_and_its_optional_frameworks() -> None:
    found = third_party_imports(ROOT / "sdk" / "trainguard_sdk")
    assert found.keys() <= SDK_OPTIONAL, {k: v for k, v in found.items()
                                          if k not in SDK_OPTIONAL}
    assert declared("trainguard-sdk") == set()  # pip install ./sdk installs nothing else
