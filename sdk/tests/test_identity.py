"""Identity from each launcher's variables, the precedence between them, and one-line errors
(property tests with hypothesis: tests/unit/test_sdk_identity.py in the service)."""

from __future__ import annotations

import pytest

from trainguard_sdk import IdentityError, Layout, identity_from_env
from trainguard_sdk.identity import composite_epoch

TORCHRUN = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "GROUP_RANK": "2",
            "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "llm-7",
            "TORCHELASTIC_RESTART_COUNT": "3", "MASTER_ADDR": "n0", "MASTER_PORT": "29500"}
SLURM = {"SLURM_JOB_ID": "123456", "SLURM_PROCID": "6", "SLURM_NTASKS": "16",
         "SLURM_LOCALID": "2", "SLURM_NODEID": "1", "SLURM_STEP_ID": "0"}
ACTUATOR = {"TRAINGUARD_JOB_ID": "demo-job", "TRAINGUARD_RANK": "3", "TRAINGUARD_WORLD_SIZE": "4",
            "TRAINGUARD_BINDING_EPOCH": "7", "TRAINGUARD_UNIT": "u3"}


def test_torchrun() -> None:
    ident = identity_from_env(TORCHRUN)
    assert (ident.launcher, ident.job_id, ident.rank, ident.world_size, ident.local_rank,
            ident.node_rank, ident.binding_epoch) == ("torchelastic", "llm-7", 5, 8, 1, 2, 3)
    assert (ident.dp_rank, ident.pp_stage, ident.tp_rank) == (5, 0, 0)


def test_slurm() -> None:
    ident = identity_from_env(SLURM)
    assert (ident.launcher, ident.job_id, ident.rank, ident.world_size, ident.local_rank,
            ident.node_rank, ident.binding_epoch) == ("slurm", "123456", 6, 16, 2, 1, 0)


def test_the_actuator_wins_over_torchrun_and_slurm() -> None:
    ident = identity_from_env({**SLURM, **TORCHRUN, **ACTUATOR})
    assert (ident.launcher, ident.job_id, ident.rank, ident.world_size, ident.binding_epoch) == (
        "trainguard", "demo-job", 3, 4, 7)


def test_torchrun_under_slurm_takes_torchruns_rank_and_slurms_job_when_no_rdzv_id() -> None:
    env = {**SLURM, **TORCHRUN, "TORCHELASTIC_RUN_ID": "none", "SLURM_STEP_ID": "2"}
    ident = identity_from_env(env)
    assert (ident.launcher, ident.job_id, ident.rank, ident.world_size) == (
        "torchelastic", "123456", 5, 8)
    assert ident.binding_epoch == 2 * 1024 + 3


def test_explicit_arguments_win() -> None:
    ident = identity_from_env(TORCHRUN, job_id="mine", rank=1, world_size=2, binding_epoch=9)
    assert (ident.launcher, ident.job_id, ident.rank, ident.world_size, ident.binding_epoch) == (
        "explicit", "mine", 1, 2, 9)


def test_no_launcher_is_a_single_process() -> None:
    ident = identity_from_env({"TRAINGUARD_JOB_ID": "j"})
    assert (ident.launcher, ident.rank, ident.world_size, ident.binding_epoch) == (
        "single", 0, 1, 0)


def test_the_epoch_follows_restarts_and_requeues() -> None:
    epochs = [composite_epoch(e) for e in (
        {}, {"TORCHELASTIC_RESTART_COUNT": "1"}, {"SLURM_STEP_ID": "1"},
        {"SLURM_STEP_ID": "1", "TORCHELASTIC_RESTART_COUNT": "4"},
        {"SLURM_RESTART_COUNT": "1"}, {"SLURM_RESTART_COUNT": "1", "SLURM_STEP_ID": "3"})]
    assert epochs == sorted(set(epochs))
    assert composite_epoch({"SLURM_STEP_ID": str(0xFFFFFFFE)}) == 0  # the batch step


def test_layout_megatron_order() -> None:
    env = {"TRAINGUARD_JOB_ID": "j", "WORLD_SIZE": "8"}
    got = [identity_from_env({**env, "RANK": str(r)}, layout=Layout(tp=2, pp=2))
           for r in range(8)]
    assert [(i.dp_rank, i.pp_stage, i.tp_rank) for i in got] == [
        (0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1), (0, 1, 0), (0, 1, 1), (1, 1, 0), (1, 1, 1)]
    assert {(i.dp_size, i.pp_size, i.tp_size) for i in got} == {(2, 2, 2)}


@pytest.mark.parametrize(("env", "kwargs", "message"), [
    ({"RANK": "x", "WORLD_SIZE": "2", "TRAINGUARD_JOB_ID": "j"}, {}, "RANK='x': not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2", "TRAINGUARD_JOB_ID": "j"}, {}, "RANK: 2 is not in 0..1"),
    ({"RANK": "0", "TRAINGUARD_JOB_ID": "j"}, {}, "WORLD_SIZE is not"),
    ({"RANK": "0", "WORLD_SIZE": "1"}, {}, "no job id"),
    ({"TRAINGUARD_JOB_ID": "a b"}, {}, "TRAINGUARD_JOB_ID: 'a b' is not a job id"),
    ({"TRAINGUARD_JOB_ID": "j", "TRAINGUARD_BINDING_EPOCH": "-1"}, {},
     "TRAINGUARD_BINDING_EPOCH='-1': must be >= 0"),
    ({"TRAINGUARD_JOB_ID": "j", "RANK": "0", "WORLD_SIZE": "6"}, {"layout": Layout(tp=4)},
     "not a multiple of tp*pp = 4"),
    ({"TRAINGUARD_JOB_ID": "j"}, {"rank": 0}, "give both or neither"),
])
def test_errors_are_one_line_and_name_the_variable(env: dict[str, str], kwargs: dict[str, object],
                                                   message: str) -> None:
    with pytest.raises(IdentityError) as err:
        identity_from_env(env, **kwargs)  # type: ignore[arg-type]
    assert message in str(err.value) and "\n" not in str(err.value)
