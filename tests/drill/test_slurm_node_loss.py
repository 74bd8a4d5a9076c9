"""`slurm-node-loss` end to end on the real dev Slurm cluster (3 nodes + 1 spare, an agent per
node): the reference workload's ranks launched as Slurm steps by the actuator's slurm backend,
streams, decide and the incident service on the cluster's broker; node tgn2 lost (link down,
slurmd, agent and rank killed). The conclusion must be "recovered automatically", backed by the
four questions, progress continuous from the checkpoint, the old step gone in Slurm's own view,
the spare bound; `verify` reproduces it; nothing of the cluster is left. Minutes; needs root,
slurm-wlm and munge."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid

import pytest

from trainguard.dev.slurm import BRIDGE, NETNS_PREFIX
from trainguard.drills.evidence.evaluate import Evaluation
from trainguard.drills.runner import run_drills, runs_root
from trainguard.drills.scenario import resolve
from trainguard.drills.verify import verify_run
from trainguard.events.codec import decode

# Not `drill` yet: every evidence check now holds on the Slurm backend (runs 5-9 of
# 2026-12-05 in a row: recovered automatically), but 3 runs in 10 on the loaded 2-core machine
# ended "needs manual confirmation": after the recovery a straggler verdict (bursts: load
# noise) opened on some rank, decide's tier 1 (raise_quota) was refused by the slurm backend
# (no per-step CPU quota) and decide escalated. That is the loop's behaviour on Slurm, not the
# drill's: it wants decide to skip tier 1 where the backend has none. `cluster`: no CI tier.
pytestmark = pytest.mark.cluster

NAME = "slurm-node-loss"


@pytest.mark.timeout(1200)
def test_slurm_node_loss_recovers_automatically_on_the_spare() -> None:
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        pytest.fail("needs Debian's slurm-wlm and munge (apt-get install slurm-wlm munge)",
                    pytrace=False)
    root = runs_root() / "tests" / uuid.uuid4().hex[:8]
    run_dir = run_drills(resolve([NAME]), root=root, signer="ci")
    # nothing of the cluster is left: namespaces, bridge
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert NETNS_PREFIX not in netns, netns
    assert subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0
    meta = json.loads((run_dir / "run.json").read_text())
    sdir = run_dir / NAME
    ev = Evaluation.from_dict(json.loads((sdir / "evaluation.json").read_text()))
    checks = {c.name: c for c in (*ev.checks, *ev.expectations)}
    detail = [(c.name, c.status.value, c.detail) for c in (*ev.checks, *ev.expectations)]
    assert meta["scenarios"][NAME]["abort"] is None, meta["scenarios"][NAME]
    assert ev.conclusion.value == "recovered automatically", (ev.reasons, detail)
    events = [decode(line) for line in (sdir / "events.jsonl").read_bytes().splitlines()]
    types = {e.type for e in events}
    assert {"injection", "verdict", "command", "pool.unit"} <= types
    assert checks["verdict:node_silent"].status.value == "pass", detail
    assert checks["action:migrate"].status.value == "pass", detail
    assert checks["nothing_rebound_on:tgn2"].status.value == "pass", detail
    assert checks["no_duplicate_replica"].status.value == "pass", detail
    assert checks["resumed_from_last_valid_checkpoint"].event_ids
    assert checks["slurm:old_steps_gone"].status.value == "pass", detail
    assert checks["slurm:spare_bound"].status.value == "pass", detail
    assert all(ok for _, ok in verify_run(run_dir))
    shutil.rmtree(root)
