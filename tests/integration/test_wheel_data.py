"""The wheel ships the default rule set from the top-level rules/ (setup.py's build step), and
the installed package loads it: a real `pip wheel` of this tree, unpacked as an install, and a
fresh interpreter that imports trainguard from there only."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "rules", "trainguard")


def _setuptools_at_least(major: int) -> bool:
    from importlib import metadata

    try:
        return int(metadata.version("setuptools").split(".")[0]) >= major
    except (metadata.PackageNotFoundError, ValueError):
        return False


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:  # a copy: the build writes build/ and *.egg-info beside the sources
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("wheel")
    # the venv's own setuptools when it is new enough (no download), else pip's isolated build
    isolation: list[str] = []
    if _setuptools_at_least(77):
        isolation = ["--no-build-isolation"]
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation,
                    "-q", "-w", str(out), str(src)], check=True, timeout=300)
    (built,) = out.glob("trainguard-*.whl")
    return built


def test_the_wheel_contains_every_rule_set_of_rules(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for path in sorted((ROOT / "rules").glob("*.yaml")):
            member = f"trainguard/rules/sets/{path.name}"
            assert member in names, (member, sorted(n for n in names if "rules" in n))
            assert z.read(member) == path.read_bytes()


def test_the_installed_default_loads(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)  # a pure wheel: installing is unpacking it onto the path
    code = ("import trainguard, trainguard.rules.schema as s; "
            f"assert trainguard.__file__.startswith({str(site)!r}), trainguard.__file__; "
            "f = s.default_rules_file(); "
            f"assert str(f).startswith({str(site)!r}), str(f); "
            "rs = s.load_default_rules(); print(len(rs.rules), rs.version)")
    env = {**os.environ, "PYTHONPATH": str(site)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120, check=False, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    from trainguard.rules import load_default_rules

    here = load_default_rules()
    assert proc.stdout.split() == [str(len(here.rules)), here.version]
