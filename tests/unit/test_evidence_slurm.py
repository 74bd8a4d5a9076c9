"""The resource checks on a Slurm-shaped recovery: the fenced replica is a step confirmed gone
(typed ``stopped``, not the local backend's pid line), and the bound pid is the ``srun`` client
on the head, which the census skips: the uid comes from the rank's own process."""

from __future__ import annotations

import dataclasses

import pytest

from trainguard.drills.evidence.log import JobLog, index
from trainguard.drills.evidence.model import Artifacts, Status
from trainguard.drills.evidence.resources import (
    binding_kept_quota_and_permissions,
    old_resources_released,
)
from trainguard.drills.evidence.slurm import slurm_checks
from trainguard.drills.synth import JOB, Knobs, synth_drill
from trainguard.events.envelope import Event
from trainguard.events.payloads import Command, PoolUnit, StopProof, UnitState, Verdict

SRUN = 9000  # the srun clients' pids: 9000 + 100 * epoch + rank


def slurm_shaped(stopped: StopProof | None) -> tuple[JobLog, Artifacts]:
    """The synthetic drill with the Slurm backend's unit events: released names the step,
    ``stopped`` is typed, and every bound pid is an srun client the census never saw."""
    events, _, art = synth_drill(Knobs())
    out: list[Event] = []
    for e in events:
        p = e.payload
        if isinstance(p, PoolUnit) and p.rank is not None and p.epoch is not None:
            upd: dict[str, object] = {"pid": SRUN + 100 * p.epoch + p.rank}
            if p.state is UnitState.FENCED:
                upd |= {"released": [f"slurm step 1.{p.rank} (tg.r{p.rank}.e1) on {p.unit}: "
                                     "cancelled, confirmed gone", f"node {p.unit}"],
                        "stopped": stopped}
            e = e.model_copy(update={"payload": p.model_copy(update=upd)})
        out.append(e)
    return index(out, JOB), art


@pytest.mark.parametrize("how", [StopProof.SIGTERM, StopProof.SIGKILL, StopProof.ALREADY_GONE])
def test_a_slurm_step_confirmed_gone_is_released(how: StopProof) -> None:
    log, art = slurm_shaped(how)
    c = old_resources_released(log, art)
    assert c.status is Status.PASS, c.detail
    assert "confirmed gone" in c.detail and c.event_ids


def test_a_step_never_signalled_or_without_proof_is_not_released() -> None:
    for stopped in (StopProof.NOT_OURS, None):  # None: an older log; no local pid line either
        log, art = slurm_shaped(stopped)
        c = old_resources_released(log, art)
        assert c.status is Status.FAIL, (stopped, c.detail)
        assert "not confirmed stopped" in c.detail


def test_the_uid_of_an_srun_binding_is_the_rank_process_s() -> None:
    log, art = slurm_shaped(StopProof.SIGKILL)
    assert not set(art.uids) & {SRUN + 100 * e + r for e in (1, 2) for r in range(3)}
    assert binding_kept_quota_and_permissions(log, art).status is Status.PASS
    changed = dataclasses.replace(art, uids={**art.uids, 2001: 1000})  # rank 1's epoch 2
    c = binding_kept_quota_and_permissions(log, changed)
    assert c.status is Status.FAIL and "uid 0 -> 1000" in c.detail
    unseen = dataclasses.replace(art, uids={})
    assert binding_kept_quota_and_permissions(log, unseen).status is Status.UNEXPLAINED


def _facts(log: JobLog) -> dict[str, object]:
    """Slurm's word as the runner reads it, on the synthetic drill's units and command."""
    cmd = log.commands[0].payload
    assert isinstance(cmd, Command)
    return {"node": "u1", "node_state": "down DRAIN NOT_RESPONDING",
            "node_reason": f"trainguard {cmd.command_id} verdicts v1",
            "steps": [{"rank": 1, "epoch": 1, "step_id": "1.1", "listed": True,
                       "listed_state": "RUNNING", "gone": True}],
            "spare_steps": [{"rank": 1, "epoch": 2, "step_id": "1.7", "unit": "spare0",
                             "listed": True}]}


def test_the_slurm_checks_cite_the_events_slurm_bears_out() -> None:
    log, _ = slurm_shaped(StopProof.SIGKILL)
    facts = _facts(log)
    checks = {c.name: c for c in slurm_checks(facts, log)}
    assert all(c.status is Status.PASS for c in checks.values()), checks
    fenced = {e.event_id for e in log.unit_events(UnitState.FENCED)
              if isinstance(e.payload, PoolUnit) and e.payload.unit == "u1"}
    assert set(checks["slurm:old_steps_gone"].event_ids) == fenced and fenced
    named = {log.commands[0].event_id} | {
        e.event_id for e in log.verdicts
        if isinstance(e.payload, Verdict) and e.payload.verdict_id == "v1"}
    assert set(checks["slurm:lost_node_out_of_service"].event_ids) == named
    assert len(named) >= 2  # the command and the verdict the reason names
    bound = checks["slurm:spare_bound"].event_ids
    assert len(bound) == 1 and bound[0] in {e.event_id for e in log.unit_events(UnitState.BOUND)}
    # a step still alive, a reason not trainguard's, no step on a spare: each fails
    alive = {**facts, "steps": [{**facts["steps"][0], "gone": False}]}  # type: ignore[index]
    assert slurm_checks(alive, log)[0].status is Status.FAIL
    other = {**facts, "node_reason": "Not responding"}
    assert slurm_checks(other, log)[1].status is Status.FAIL
    assert slurm_checks({**facts, "spare_steps": []}, log)[2].status is Status.FAIL
