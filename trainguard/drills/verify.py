"""`trainguard drill verify RUN`: recompute each scenario's conclusion from what the run
recorded (its log, archives, baseline) and compare with the recorded evaluation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from trainguard.drills.evidence.evaluate import Evaluation
from trainguard.drills.evidence.model import Baseline
from trainguard.drills.runner import evaluate_run, recorded_scenario
from trainguard.drills.scenario import ScenarioError


def verify_run(run_dir: Path) -> Iterator[tuple[str, bool]]:
    meta = json.loads((run_dir / "run.json").read_text())
    bpath = run_dir / "baseline.json"
    baseline = Baseline.from_dict(json.loads(bpath.read_text())) if bpath.exists() else None
    for name, s in sorted(meta["scenarios"].items()):
        if s.get("conclusion") is None:
            yield f"{name}: not run ({s.get('not_run', '')[:80]}...)", True
            continue
        try:
            scenario = recorded_scenario(run_dir / name, name, s["source"])
        except ScenarioError as exc:
            yield f"{name}: scenario unreadable: {exc}", False
            continue
        recorded = Evaluation.from_dict(json.loads((run_dir / name / "evaluation.json")
                                                   .read_text()))
        again = evaluate_run(run_dir / name, scenario, baseline)
        if again == recorded:
            yield f"{name}: {again.conclusion.value} (reproduced from the recorded log)", True
        else:
            changed = [c.name for c, d in zip(recorded.checks, again.checks, strict=False)
                       if c != d]
            yield (f"{name}: recorded {recorded.conclusion.value}, recomputed "
                   f"{again.conclusion.value}; checks that differ: {changed}"), False
