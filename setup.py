"""The build steps pyproject.toml cannot say.

* The rule sets a user edits live in the top-level ``rules/`` folder, and the wheel ships them
  inside the package (``trainguard/rules/sets/``), where ``trainguard.rules.load_default_rules``
  finds them once installed (rules/README.md).
* With ``TRAINGUARD_NATIVE=1``, mypyc compiles the rules' hot modules
  (``trainguard/rules/native.py``: which, and why) and a stamp of their sources is written
  beside them. mypyc type-checks with the project's own mypy settings, so it needs trainguard's
  dependencies and mypy installed: build without isolation (``pip install
  --no-build-isolation``, or ``python setup.py build_ext --inplace`` as ``./tg setup`` does).
  Without it the rules run as pure Python, the same code, about half as fast.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
RULES = ROOT / "rules"
PACKAGED = Path("trainguard") / "rules" / "sets"


def _native() -> ModuleType:
    """trainguard/rules/native.py by path: the package's dependencies may not be installed."""
    spec = importlib.util.spec_from_file_location("_tg_native", ROOT / "trainguard/rules/native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithRules(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads rules/ in place
            return
        target = Path(self.build_lib) / PACKAGED
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted(RULES.glob("*.yaml")):
            shutil.copyfile(path, target / path.name)


class BuildExtWithStamp(build_ext):
    """Builds the compiled rules, then stamps them with their sources' digests."""

    def run(self) -> None:
        super().run()
        if not self.extensions:
            return
        sources = ROOT / "trainguard" / "rules"  # what mypyc compiled
        target = sources if self.inplace else Path(self.build_lib) / "trainguard" / "rules"
        _native().write_stamp(target, sources)


def native_extensions() -> list[Any]:
    if os.environ.get("TRAINGUARD_NATIVE") != "1":
        return []
    from mypyc.build import mypycify  # mypy's compiler: ./tg and the Dockerfile install it

    native = _native()
    return list(mypycify([f"trainguard/rules/{m}.py" for m in native.MODULES],
                         group_name=native.GROUP, opt_level="3"))


setup(cmdclass={"build_py": BuildPyWithRules, "build_ext": BuildExtWithStamp},
      ext_modules=native_extensions())
