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
from trainguard.drills.synth import JOB, Knobs, synth_drill
from trainguard.events.envelope import Event
from trainguard.events.payloads import PoolUnit, StopProof, UnitState

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
