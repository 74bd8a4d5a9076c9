"""The compiled rules (trainguard/rules/native.py): the same verdicts as the pure sources, and a
stale build never runs."""

from __future__ import annotations

import hashlib
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard.events.codec import encode
from trainguard.quality.cases import all_cases
from trainguard.rules import RuleEngine, load_default_rules, native, replay
from trainguard.rules.epochs import EpochGate
from trainguard.rules.ordering import ReorderBuffer
from trainguard.rules.registry import EVALUATORS

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def case_digests() -> dict[str, str]:
    """Each quality-suite case (the 16k-rank ones left out) replayed with the default rules:
    the SHA-256 of its verdicts' bytes, in order."""
    rules = load_default_rules()
    out: dict[str, str] = {}
    for case in all_cases():
        if "large" in case.tags:
            continue
        events = case.build()
        if not events:
            continue
        h = hashlib.sha256()
        for v in replay(events, rules, events[0].job_id):
            h.update(encode(v))
        out[case.name] = h.hexdigest()
    return out


def test_every_evaluator_and_the_engine_are_in_the_compiled_list() -> None:
    compiled = {f"{native.PACKAGE}.{m}" for m in native.MODULES}
    assert {cls.__module__ for cls in EVALUATORS.values()} <= compiled
    assert {RuleEngine.__module__, ReorderBuffer.__module__, EpochGate.__module__} <= compiled
    assert all(p.exists() for p in native.sources())


def run_pure(code: str) -> str:
    env = {**os.environ, native.PURE_ENV: "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=True)
    return done.stdout


@pytest.mark.skipif(not native.mode().startswith("compiled"),
                    reason=f"the rules are not compiled here: {native.mode()}")
def test_compiled_rules_give_the_pure_sources_verdicts_byte_for_byte() -> None:
    pure = json.loads(run_pure(
        "import json; from tests.unit.test_native import case_digests; "
        "from trainguard.rules import native, engine; "
        "assert native.mode().startswith('pure'), native.mode(); "
        "assert engine.__file__.endswith('.py'), engine.__file__; "
        "print(json.dumps(case_digests()))"))
    compiled = case_digests()
    assert len(compiled) >= 20
    assert compiled == pure


def test_pure_mode_imports_every_compiled_module_from_its_source() -> None:
    out = run_pure("import importlib; from trainguard.rules import native; "
                   "print(native.mode()); "
                   "print(*(importlib.import_module(f'trainguard.rules.{m}').__file__ "
                   "for m in native.MODULES), sep='\\n')")  # a clone path may hold a space
    mode, *files = out.splitlines()
    assert mode == "pure Python (TRAINGUARD_PURE=1)"
    assert sorted(Path(f).name for f in files) == sorted(f"{m}.py" for m in native.MODULES)


def copy_sources(tmp: Path) -> Path:
    for path in native.sources():
        shutil.copyfile(path, tmp / path.name)
    return tmp


def test_a_source_edited_after_the_build_is_found_and_the_build_is_not_fresh(
        tmp_path: Path) -> None:
    root = copy_sources(tmp_path)
    native.write_stamp(root)
    for module in native.MODULES:  # stand-ins for the extensions the build would leave
        (root / f"{module}{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    stamp = native.read_stamp(root / native.STAMP.name)
    assert stamp is not None
    assert native.changed(stamp, native.digests(root)) == []
    assert native.fresh(root)
    with (root / "steps.py").open("a") as f:
        f.write("\n# edited\n")
    assert native.changed(stamp, native.digests(root)) == ["steps.py"]
    assert not native.fresh(root)


def test_a_build_for_another_python_or_without_its_extensions_is_not_fresh(
        tmp_path: Path) -> None:
    root = copy_sources(tmp_path)
    assert not native.fresh(root)  # no stamp
    native.write_stamp(root)
    assert not native.fresh(root)  # a stamp, no extensions
    for module in native.MODULES:
        (root / f"{module}{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"")
    doc = json.loads((root / native.STAMP.name).read_text())
    (root / native.STAMP.name).write_text(json.dumps({**doc, "ext_suffix": ".cpython-39.so"}))
    assert not native.fresh(root)
    (root / native.STAMP.name).write_text("not json")
    assert native.read_stamp(root / native.STAMP.name) is None
    assert not native.fresh(root)


def test_the_pure_finder_answers_only_for_the_compiled_modules(tmp_path: Path) -> None:
    finder = native.PureFinder(copy_sources(tmp_path))
    spec = finder.find_spec("trainguard.rules.straggler", None)
    assert spec is not None and spec.origin == str(tmp_path / "straggler.py")
    assert isinstance(spec.loader, importlib.machinery.SourceFileLoader)
    assert finder.find_spec("trainguard.rules.schema", None) is None
    assert finder.find_spec("json", None) is None


def test_a_stale_build_runs_pure_with_one_warning(tmp_path: Path) -> None:
    """A whole copy of the package whose stamp disagrees with one source: every compiled module
    is then imported from its .py, and the warning names the source."""
    pkg = tmp_path / "trainguard"
    shutil.copytree(ROOT / "trainguard", pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "_native.json"))
    rules = pkg / "rules"
    native.write_stamp(rules)
    doc = json.loads((rules / native.STAMP.name).read_text())
    doc["sources"]["slowdown.py"] = "0" * 64
    (rules / native.STAMP.name).write_text(json.dumps(doc))
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    env["PYTHONPATH"] = str(tmp_path)
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c",
         "from trainguard.rules import native, slowdown; print(native.mode(), slowdown.__file__)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.split() == ["pure", "Python", "(stale", "build)",
                                   str(rules / "slowdown.py")]
    assert done.stderr.count("RuntimeWarning") == 1
    assert "slowdown.py changed since the rules were compiled" in done.stderr
