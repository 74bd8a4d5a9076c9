"""The build step pyproject.toml cannot say: the rule sets a user edits live in the top-level
``rules/`` folder, and the wheel ships them inside the package (``trainguard/rules/sets/``),
where ``trainguard.rules.load_default_rules`` finds them once installed (rules/README.md)."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

RULES = Path(__file__).resolve().parent / "rules"
PACKAGED = Path("trainguard") / "rules" / "sets"


class BuildPyWithRules(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads rules/ in place
            return
        target = Path(self.build_lib) / PACKAGED
        target.mkdir(parents=True, exist_ok=True)
        for path in sorted(RULES.glob("*.yaml")):
            shutil.copyfile(path, target / path.name)


setup(cmdclass={"build_py": BuildPyWithRules})
