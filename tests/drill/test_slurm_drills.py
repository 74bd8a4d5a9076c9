"""The Slurm drills end to end on the real dev Slurm cluster (3 nodes + 1 spare, an agent per
node): the reference workload's ranks launched as Slurm steps by the actuator's slurm backend,
streams, decide and the incident service on the cluster's broker. In one run (one cluster):
`slurm-node-loss` (tgn2's link down, slurmd, agent and rank killed), `slurm-rank-kill` (rank 1
SIGKILLed on a healthy node), `slurm-partition` (tgn2 cut off with everything on it running),
`slurm-node-loss-broker-outage` (tgn2 lost while the broker is stopped for 20 s),
`slurm-master-node-loss` (tgn1 lost: rank 0's node, where the ranks meet),
`slurm-elastic-node-loss` (tgn2 lost under a torchrun job: only its agent is replaced, the
survivors' agents restart their workers into the new rendezvous round).
Each must conclude "recovered automatically", backed by the four questions, progress
continuous from the checkpoint, the old step gone in Slurm's own view, the spare bound;
`verify` reproduces them; each job is ended by cancelling its allocation, which the actuator
says (``job.ended``) and nobody is called about; nothing of the cluster is left. Minutes;
needs root, slurm-wlm and munge. `slurm-straggler-node` is not here: its verdict depends on
how loaded the machine is (`trainguard drill run slurm-straggler-node` runs it)."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.actuators.pool import LAUNCH_EPOCH
from trainguard.dev.slurm import BRIDGE, NETNS_PREFIX
from trainguard.drills.evidence.evaluate import Evaluation
from trainguard.drills.runner import run_drills, runs_root
from trainguard.drills.scenario import resolve
from trainguard.drills.verify import verify_run
from trainguard.events.codec import decode
from trainguard.events.payloads import (
    Command,
    CommandAction,
    JobEnded,
    PoolUnit,
    SchedulerEnd,
    UnitState,
)

pytestmark = pytest.mark.drill

# scenario -> the verdict it must raise, and whether the node it names must never get ranks
SCENARIOS = {"slurm-node-loss": ("node_silent", "tgn2"),
             "slurm-rank-kill": ("process_exit", None),
             "slurm-partition": ("node_silent", "tgn2"),
             "slurm-node-loss-broker-outage": ("node_silent", "tgn2"),
             "slurm-master-node-loss": ("node_silent", "tgn1"),
             "slurm-elastic-node-loss": ("node_silent", "tgn2")}
ELASTIC = frozenset({"slurm-elastic-node-loss"})  # torchrun: a migrate moves the lost node only


@pytest.fixture(scope="module")
def run_dir(request: pytest.FixtureRequest) -> Iterator[Path]:
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        pytest.fail("needs Debian's slurm-wlm and munge (apt-get install slurm-wlm munge)",
                    pytrace=False)
    root = runs_root() / "tests" / uuid.uuid4().hex[:8]
    out = run_drills(resolve(list(SCENARIOS)), root=root, signer="ci")
    # nothing of the cluster is left: namespaces, bridge
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert NETNS_PREFIX not in netns, netns
    assert subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0
    failed = request.session.testsfailed
    yield out
    if request.session.testsfailed == failed:  # kept for a look when a check failed
        shutil.rmtree(root)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_recovered_automatically_on_the_spare(run_dir: Path, name: str) -> None:
    verdict, lost = SCENARIOS[name]
    meta = json.loads((run_dir / "run.json").read_text())
    sdir = run_dir / name
    ev = Evaluation.from_dict(json.loads((sdir / "evaluation.json").read_text()))
    checks = {c.name: c for c in (*ev.checks, *ev.expectations)}
    detail = [(c.name, c.status.value, c.detail) for c in (*ev.checks, *ev.expectations)]
    assert meta["scenarios"][name]["abort"] is None, meta["scenarios"][name]
    assert ev.conclusion.value == "recovered automatically", (ev.reasons, detail)
    events = [decode(line) for line in (sdir / "events.jsonl").read_bytes().splitlines()]
    assert {"injection", "verdict", "command", "pool.unit"} <= {e.type for e in events}
    assert checks[f"verdict:{verdict}"].status.value == "pass", detail
    assert checks["action:migrate"].status.value == "pass", detail
    if lost is not None:
        assert checks[f"nothing_rebound_on:{lost}"].status.value == "pass", detail
    assert checks["no_duplicate_replica"].status.value == "pass", detail
    assert checks["resumed_from_last_valid_checkpoint"].event_ids
    assert checks["slurm:old_steps_gone"].status.value == "pass", detail
    assert checks["slurm:spare_bound"].status.value == "pass", detail
    units = [e.payload for e in events if isinstance(e.payload, PoolUnit)]
    fenced = sorted(u.unit for u in units if u.state is UnitState.FENCED)
    kept = sorted(u.unit for u in units if u.state is UnitState.BOUND
                  and LAUNCH_EPOCH in u.resources)
    if name in ELASTIC:  # the survivors' agents never fenced, bound at the new epoch in place
        assert (fenced, kept) == ([lost], sorted({"tgn1", "tgn3"} - {lost})), (fenced, kept)
    else:  # every rank relaunched: nothing kept in place
        assert kept == [], kept
    # the drill ends its job as a user does, by cancelling the allocation: the actuator says
    # so, and the ranks' exits call nobody
    closed = json.loads((sdir / "archive.json").read_text())["window"]["closed_us"]
    after = [e for e in events if e.event_time > closed]
    assert [e.payload.end for e in after if isinstance(e.payload, JobEnded)] == \
        [SchedulerEnd.CANCELLED], [e.type for e in after]
    assert not [e for e in after if isinstance(e.payload, Command)
                and e.payload.action is CommandAction.ESCALATE]


def test_verify_reproduces_every_conclusion(run_dir: Path) -> None:
    assert all(ok for _, ok in verify_run(run_dir))
