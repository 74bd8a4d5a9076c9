"""Properties of the launcher identity (trainguard_sdk.identity): any environment gives a
valid identity or one IdentityError line; launcher values come through exactly; the epoch
orders restarts; the layout is a bijection."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from trainguard_sdk import Identity, IdentityError, Layout, identity_from_env
from trainguard_sdk.identity import (
    ELASTIC_MAX,
    ENV_BINDING_EPOCH_FILE,
    REQUEUE_MAX,
    STEP_MAX,
    composite_epoch,
    epoch_file,
)

KEYS = ("TRAINGUARD_JOB_ID", "TRAINGUARD_RANK", "TRAINGUARD_WORLD_SIZE",
        "TRAINGUARD_BINDING_EPOCH", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GROUP_RANK",
        "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID", "SLURM_PROCID",
        "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_STEP_ID",
        "SLURM_RESTART_COUNT")
VALUES = st.one_of(st.integers(-3, 40).map(str), st.text(max_size=8),
                   st.sampled_from(["none", "", " 3", "job-1", "99999999999"]))


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), VALUES),
       st.sampled_from([Layout(), Layout(tp=2), Layout(tp=2, pp=2)]))
def test_any_environment_gives_a_valid_identity_or_one_error_line(
        env: dict[str, str], layout: Layout) -> None:
    try:
        ident = identity_from_env(env, layout=layout)
    except IdentityError as exc:
        assert str(exc) and "\n" not in str(exc)
        return
    assert isinstance(ident, Identity)
    assert 0 <= ident.rank < ident.world_size
    assert ident.dp_size * ident.pp_size * ident.tp_size == ident.world_size
    assert 0 <= ident.binding_epoch < 2**32


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4096).flatmap(lambda w: st.tuples(st.just(w), st.integers(0, w - 1))),
       st.integers(0, 7), st.integers(0, 511), st.integers(0, ELASTIC_MAX),
       st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}", fullmatch=True))
def test_torchrun_values_come_through_exactly(world_rank: tuple[int, int], local: int, node: int,
                                              restarts: int, run_id: str) -> None:
    world, rank = world_rank
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
           "GROUP_RANK": str(node), "TORCHELASTIC_RESTART_COUNT": str(restarts),
           "TORCHELASTIC_RUN_ID": run_id}
    ident = identity_from_env(env)
    want_job = "x" if run_id == "none" else run_id
    if run_id == "none":
        ident = identity_from_env({**env, "SLURM_JOB_ID": "x"})
    assert (ident.launcher, ident.job_id, ident.rank, ident.world_size, ident.local_rank,
            ident.node_rank, ident.binding_epoch, ident.dp_rank) == (
        "torchelastic", want_job, rank, world, local, node, restarts, rank)


COUNTERS = st.tuples(st.integers(0, REQUEUE_MAX), st.integers(0, STEP_MAX),
                     st.integers(0, ELASTIC_MAX))


def _env(c: tuple[int, int, int]) -> dict[str, str]:
    return {"SLURM_RESTART_COUNT": str(c[0]), "SLURM_STEP_ID": str(c[1]),
            "TORCHELASTIC_RESTART_COUNT": str(c[2])}


@settings(max_examples=300, deadline=None)
@given(COUNTERS, COUNTERS)
def test_the_epoch_orders_restarts_like_the_counters(a: tuple[int, int, int],
                                                     b: tuple[int, int, int]) -> None:
    ea, eb = composite_epoch(_env(a)), composite_epoch(_env(b))
    assert (ea < eb) == (a < b) and (ea == eb) == (a == b)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8), st.integers(1, 8))
def test_the_layout_is_a_bijection(tp: int, pp: int, dp: int) -> None:
    layout, world = Layout(tp=tp, pp=pp), tp * pp * dp
    coords = [layout.coordinates(r, world) for r in range(world)]
    assert len(set(coords)) == world
    assert all(0 <= d < dp and 0 <= p < pp and 0 <= t < tp for d, p, t in coords)


@settings(max_examples=200, deadline=None)
@given(st.permutations(["pp", "dp", "tp"]), st.integers(1, 4), st.integers(1, 4),
       st.integers(1, 4), st.data())
def test_a_layout_is_found_again_from_its_groups(order: list[str], tp: int, pp: int, dp: int,
                                                 data: st.DataObject) -> None:
    """The ranks of one rank's tp and pp groups under any order give back the same layout."""
    layout, world = Layout(tp=tp, pp=pp, order=tuple(order)), tp * pp * dp
    coords = [layout.coordinates(r, world) for r in range(world)]
    me = coords[data.draw(st.integers(0, world - 1))]
    tp_group = [r for r, c in enumerate(coords) if c[:2] == me[:2]]  # same dp and pp
    pp_group = [r for r, c in enumerate(coords) if (c[0], c[2]) == (me[0], me[2])]
    found = Layout.from_ranks(world, tp=tp_group, pp=pp_group)
    assert [found.coordinates(r, world) for r in range(world)] == coords
    # and the mesh of that order (row-major over it) gives it too
    sizes = {"pp": pp, "dp": dp, "tp": tp}
    mesh = Layout.from_dims([(name, sizes[name]) for name in order])
    assert [mesh.coordinates(r, world) for r in range(world)] == coords


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=80),
                 st.integers(min_value=0, max_value=2**33).map(lambda n: f"{n}\n".encode())))
def test_any_epoch_file_gives_its_epoch_or_one_line(tmp_path_factory: Any, raw: bytes) -> None:
    """Whatever bytes the epoch file holds (it is on shared storage, outside the process):
    the epoch when it is a decimal u32, else an ``IdentityError`` of one line naming the
    variable; never another exception."""
    path = tmp_path_factory.mktemp("epoch") / "epoch"
    path.write_bytes(raw)
    env = {ENV_BINDING_EPOCH_FILE: str(path)}
    text = raw.decode("ascii", "replace").strip()
    try:
        got = epoch_file(env)
    except IdentityError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(ENV_BINDING_EPOCH_FILE)
        assert not (text.isdigit() and int(text) <= 2**32 - 1 and len(raw) <= 64)
    else:
        assert got == int(text) and got <= 2**32 - 1
