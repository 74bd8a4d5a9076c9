"""One scenario on the whole loop, for real: a real broker (the drills' own), agent, streams,
decision service, actuator and incident service; a 4-rank PyTorch DDP job; rank 1 killed with
SIGKILL. The conclusion must be backed by evidence, and `verify` must reproduce it from the
recorded files alone. Minutes on this machine; needs root."""

from __future__ import annotations

import json
import shutil
import uuid

import pytest

from trainguard.drills.evidence.evaluate import Evaluation
from trainguard.drills.report import write_reports
from trainguard.drills.runner import run_drills, runs_root
from trainguard.drills.scenario import resolve
from trainguard.drills.verify import verify_run
from trainguard.events.codec import decode


@pytest.mark.timeout(900)
def test_worker_exit_recovers_with_evidence_and_verify_reproduces_it() -> None:
    # not under /tmp: the workload refuses a scratch checkpoint directory
    root = runs_root() / "tests" / uuid.uuid4().hex[:8]
    run_dir = run_drills(resolve(["r1-worker-exit"]), root=root, signer="ci")
    meta = json.loads((run_dir / "run.json").read_text())
    sdir = run_dir / "r1-worker-exit"
    ev = Evaluation.from_dict(json.loads((sdir / "evaluation.json").read_text()))
    checks = {c.name: c for c in ev.checks}
    assert meta["scenarios"]["r1-worker-exit"]["conclusion"] == ev.conclusion.value
    # the log holds the injection and the loop's response, every line a valid event
    types = [decode(line).type for line in (sdir / "events.jsonl").read_bytes().splitlines()]
    assert "injection" in types and "verdict" in types and "pool.unit" in types
    assert ev.conclusion.value == "recovered automatically", (
        ev.reasons, [(c.name, c.status.value, c.detail) for c in ev.checks])
    assert checks["resumed_from_last_valid_checkpoint"].event_ids
    assert checks["no_duplicate_replica"].status.value == "pass"
    assert all(ok for _, ok in verify_run(run_dir))
    written = write_reports(run_dir)
    assert (sdir / "report.html") in written
    assert "recovered automatically" in (sdir / "report.md").read_text()
    shutil.rmtree(root)
