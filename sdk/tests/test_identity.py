"""Identity from each launcher's variables, the precedence between them, and one-line errors
(property tests with hypothesis: tests/unit/test_sdk_identity.py in the service)."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from trainguard_sdk import IdentityError, Layout, identity_from_env, wire
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


class FakeMesh:
    """The part of torch's DeviceMesh that ``Layout.from_mesh`` reads."""

    def __init__(self, names: tuple[str, ...] | None, shape: tuple[int, ...]) -> None:
        self.mesh_dim_names = names
        self.shape = shape

    def size(self, dim: int) -> int:
        return self.shape[dim]


@pytest.mark.parametrize(("names", "shape", "want"), [
    (("pp", "dp", "tp"), (2, 2, 2), Layout(tp=2, pp=2)),  # Megatron's order
    (("dp", "tp"), (4, 2), Layout(tp=2)),
    (("dp", "pp", "tp"), (2, 2, 2), Layout(tp=2, pp=2, order=("dp", "pp", "tp"))),
    (("pp", "dp_replicate", "dp_shard", "cp", "tp"), (2, 2, 2, 1, 2), Layout(tp=2, pp=2)),
    (("data_parallel", "tensor_parallel"), (2, 4), Layout(tp=4)),  # Lightning's names
    (("tp", "dp"), (2, 4), Layout(tp=2, order=("pp", "tp", "dp"))),
    (("dp",), (8,), Layout()),
])
def test_layout_from_a_mesh(names: tuple[str, ...], shape: tuple[int, ...],
                            want: Layout) -> None:
    got = Layout.from_mesh(FakeMesh(names, shape))
    world = 1
    for n in shape:
        world *= n
    assert [got.coordinates(r, world) for r in range(world)] == [
        want.coordinates(r, world) for r in range(world)]
    assert (got.tp, got.pp, got.dp(world)) == (want.tp, want.pp, want.dp(world))


def test_a_mesh_layout_reaches_the_identity_like_a_given_one() -> None:
    env = {"TRAINGUARD_JOB_ID": "j", "WORLD_SIZE": "8"}
    mesh = FakeMesh(("dp", "pp", "tp"), (2, 2, 2))  # pp between dp and tp
    got = [identity_from_env({**env, "RANK": str(r)}, layout=Layout.from_mesh(mesh))
           for r in range(8)]
    # row-major over (dp, pp, tp): rank = dp*4 + pp*2 + tp
    assert [(i.dp_rank, i.pp_stage, i.tp_rank) for i in got] == [
        (r // 4, r // 2 % 2, r % 2) for r in range(8)]
    assert {(i.dp_size, i.pp_size, i.tp_size) for i in got} == {(2, 2, 2)}
    given = identity_from_env({**env, "RANK": "5"},
                              layout=Layout(tp=2, pp=2, order=("dp", "pp", "tp")))
    assert got[5] == given


@pytest.mark.parametrize(("world", "tp", "pp", "want"), [
    (8, [2, 3], [1, 5], Layout(tp=2, pp=2)),  # Megatron: tp stride 1, pp stride tp*dp = 4
    (8, [4, 5], [5, 7], Layout(tp=2, pp=2, order=("dp", "pp", "tp"))),
    (8, [1, 5], None, Layout(tp=2, order=("tp", "dp", "pp"))),  # tp slowest: stride 4
    (4, None, None, Layout()),
])
def test_layout_from_group_ranks(world: int, tp: list[int] | None, pp: list[int] | None,
                                 want: Layout) -> None:
    got = Layout.from_ranks(world, tp=tp, pp=pp)
    assert [got.coordinates(r, world) for r in range(world)] == [
        want.coordinates(r, world) for r in range(world)]


@pytest.mark.parametrize(("make", "message"), [
    (lambda: Layout.from_mesh(FakeMesh(None, (2,))), "no dimension names"),
    (lambda: Layout.from_mesh(FakeMesh(("dp", "tp", "cp"), (2, 2, 2))), "not adjacent"),
    (lambda: Layout.from_mesh(FakeMesh(("tp", "tensor_parallel"), (2, 2))), "two tp"),
    (lambda: Layout.from_ranks(8, tp=[0, 2, 5]), "not a multiple"),
    (lambda: Layout.from_ranks(8, tp=[0, 3]), "not dimensions of a pp/dp/tp grid"),
    (lambda: Layout(order=("dp", "tp")), "Layout.order"),
])
def test_layout_errors_are_one_line(make: Callable[[], Layout], message: str) -> None:
    with pytest.raises(IdentityError) as err:
        make()
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_mesh_layout_reaches_the_step_reports(agent_socket: tuple[Path, socket.socket]) -> None:
    path, rx = agent_socket
    env = {"TRAINGUARD_JOB_ID": "j", "RANK": "6", "WORLD_SIZE": "8"}
    reports = []
    for layout in (Layout.from_mesh(FakeMesh(("dp", "pp", "tp"), (2, 2, 2))),
                   Layout(tp=2, pp=2, order=("dp", "pp", "tp"))):
        with identity_from_env(env, layout=layout).reporter(
                socket_path=path, heartbeat_interval_s=None) as tg:
            assert tg.step(1, 8, 1.0)
        frame = wire.decode(rx.recv(wire.MAX_DATAGRAM))
        rx.recv(wire.MAX_DATAGRAM)  # the closing heartbeat
        assert isinstance(frame, wire.StepFrame)
        reports.append((frame.dp_rank, frame.pp_stage, frame.tp_rank))
    assert reports == [(1, 1, 0), (1, 1, 0)]  # rank 6 = dp 1 * 4 + pp 1 * 2 + tp 0


def test_an_elastic_jobs_epoch_file_wins_once_written(tmp_path: Path) -> None:
    """The actuator re-forms an elastic job's group at a new epoch by writing it to the file:
    a worker its torchrun agent restarts (the agent's environment, epoch 7) reads 9 there."""
    path = tmp_path / "epoch"
    env = {**TORCHRUN, **ACTUATOR, "TRAINGUARD_BINDING_EPOCH_FILE": str(path)}
    assert identity_from_env(env).binding_epoch == 7  # not written yet: the launch epoch
    path.write_text("9\n")
    assert identity_from_env(env).binding_epoch == 9
    assert identity_from_env(env, binding_epoch=2).binding_epoch == 2
    for bad in ("", "nine", "-1", str(wire.U32_MAX + 1), "1" * 80):
        path.write_text(bad)
        with pytest.raises(IdentityError, match=r"^TRAINGUARD_BINDING_EPOCH_FILE=.*: not a "
                                                r"binding epoch"):
            identity_from_env(env)
    path.unlink()
    path.mkdir()
    with pytest.raises(IdentityError, match="cannot be read"):
        identity_from_env(env)
