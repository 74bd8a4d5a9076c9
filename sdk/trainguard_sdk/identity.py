"""Who this process is in the job, from the launcher's environment: a pure function from an
environment mapping to a typed ``Identity``.

    ident = identity_from_env(os.environ, layout=Layout(tp=2, pp=2))
    reporter = ident.reporter()

Launchers, in precedence order (the first whose variables are present gives rank, world size,
local rank and node rank, all four from the same launcher; they are never mixed):

1. explicit arguments (``rank=``, ``world_size=`` ...): what the script was told on its command
   line;
2. trainguard's actuator: ``TRAINGUARD_RANK`` (with ``TRAINGUARD_WORLD_SIZE``, else
   ``WORLD_SIZE``, else ``SLURM_NTASKS``): the actuator binds ranks to units, so it wins;
3. torchrun / TorchElastic: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``GROUP_RANK``: set per
   worker, so more specific than Slurm's task under which torchrun itself may run;
4. Slurm: ``SLURM_PROCID``, ``SLURM_NTASKS`` (else ``SLURM_NPROCS``), ``SLURM_LOCALID``,
   ``SLURM_NODEID``;
5. none: a single process, rank 0 of 1.

The job id (stable across restarts, so a restarted job is the same job):
``job_id=`` > ``TRAINGUARD_JOB_ID`` > ``TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``; its
default "none" does not count) > ``SLURM_JOB_ID``; none of them is an error.

The binding epoch (grows on every restart, so reports of a replaced replica are told apart):
``binding_epoch=`` > the file ``TRAINGUARD_BINDING_EPOCH_FILE`` names, when it exists >
``TRAINGUARD_BINDING_EPOCH`` (the actuator's, verbatim) > a composite of the launchers' restart
counters, each saturating at its field's maximum::

    epoch = SLURM_RESTART_COUNT * 2**20     (requeues, 0..4095)
          + SLURM_STEP_ID * 2**10           (a new srun in the allocation, 0..1023; the
                                             batch/extern/interactive steps count as 0)
          + TORCHELASTIC_RESTART_COUNT      (torchrun's worker-group restarts, 0..1023)

so plain torchrun gives 0, 1, 2 ... and torchrun under srun keeps growing when Slurm starts a
new step or requeues the job (where torchrun's own counter starts again at 0).

The file is for an elastic job run by trainguard's actuator (torchrun agents as its replicas):
a worker its agent restarts keeps the agent's environment, so when the actuator re-forms the
group at a new epoch (a spare replacing a lost node) it writes the epoch there, on the job's
storage, before the new round can start, and every worker reads it as it starts: the one file
read here. It holds a decimal integer; a file that does not exist yet leaves the next choice.

The parallel layout is given once (``Layout(tp=, pp=)``; dp is what remains of the world):
ranks are ordered tp fastest, then dp, then pp (Megatron-LM's default order), so
``tp_rank = rank % tp``, ``dp_rank = (rank // tp) % dp``, ``pp_stage = rank // (tp * dp)``;
``Layout(tp=, pp=, order=("dp", "pp", "tp"))`` names another order (slowest first). Or it is
taken from the framework (torch imported only then):

- ``Layout.from_mesh(mesh)``: a ``torch.distributed.DeviceMesh`` with named dimensions; the
  dimension named "tp" (or "tensor_parallel") gives tp, "pp" (or "pipeline_parallel") pp, and
  every other one (dp, dp_replicate, dp_shard, cp ...) is data-parallel; the order is the mesh's
  (a mesh is row-major over its ranks: its last dimension is the fastest);
- ``Layout.from_groups(tp=group, pp=group)``: torch.distributed process groups (Megatron's
  ``get_tensor_model_parallel_group()`` ...); sizes from the groups, the order from the stride
  of their ranks (``Layout.from_ranks``, pure).

Bad values raise ``IdentityError`` (a ``ValueError``) with one line naming the variable and
its value. Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import permutations
from typing import Any, Final

from trainguard_sdk import wire

ENV_JOB_ID: Final = "TRAINGUARD_JOB_ID"
ENV_RANK: Final = "TRAINGUARD_RANK"
ENV_WORLD_SIZE: Final = "TRAINGUARD_WORLD_SIZE"
ENV_BINDING_EPOCH: Final = "TRAINGUARD_BINDING_EPOCH"
ENV_BINDING_EPOCH_FILE: Final = "TRAINGUARD_BINDING_EPOCH_FILE"
EPOCH_FILE_MAX: Final = 64  # bytes read: a decimal u32 and a newline fit many times over
UNSET_RUN_ID: Final = "none"  # torchrun's --rdzv-id default
REQUEUE_SHIFT: Final = 20
STEP_SHIFT: Final = 10
REQUEUE_MAX: Final = (1 << (32 - REQUEUE_SHIFT)) - 1
STEP_MAX: Final = (1 << (REQUEUE_SHIFT - STEP_SHIFT)) - 1
ELASTIC_MAX: Final = (1 << STEP_SHIFT) - 1
SLURM_SPECIAL_STEP: Final = 0xFFFFFFF0  # batch, extern, interactive ... steps lie above

LAUNCHERS: Final = ("explicit", "trainguard", "torchelastic", "slurm", "single")
DIMS: Final = ("pp", "dp", "tp")  # Megatron-LM's default order, slowest first
MESH_TP: Final = ("tp", "tensor_parallel")  # names of a mesh's tensor-parallel dimension
MESH_PP: Final = ("pp", "pipeline_parallel")


class IdentityError(ValueError):
    """An identity that cannot be taken from the environment; one line naming the variable."""


@dataclass(frozen=True)
class Layout:
    """The parallel layout: tensor- and pipeline-parallel sizes; data-parallel is the rest.
    ``order``: the three dimensions slowest first (a rank is row-major over them)."""

    tp: int = 1
    pp: int = 1
    order: tuple[str, ...] = DIMS

    def __post_init__(self) -> None:
        for name in ("tp", "pp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise IdentityError(f"Layout.{name}: an int >= 1, got {value!r}")
        if not isinstance(self.order, tuple) or sorted(self.order) != sorted(DIMS):
            raise IdentityError(f"Layout.order: a permutation of {DIMS}, got {self.order!r}")

    def dp(self, world_size: int) -> int:
        per = self.tp * self.pp
        if world_size % per:
            raise IdentityError(f"Layout(tp={self.tp}, pp={self.pp}): world size {world_size} "
                                f"is not a multiple of tp*pp = {per}")
        return world_size // per

    def coordinates(self, rank: int, world_size: int) -> tuple[int, int, int]:
        """(dp_rank, pp_stage, tp_rank) of ``rank``."""
        sizes = {"pp": self.pp, "dp": self.dp(world_size), "tp": self.tp}
        coord: dict[str, int] = {}
        for name in reversed(self.order):  # the fastest first
            rank, coord[name] = divmod(rank, sizes[name])
        return coord["dp"], coord["pp"], coord["tp"]

    # -- taken from the framework -----------------------------------------------------------

    @classmethod
    def from_dims(cls, dims: Iterable[tuple[str, int]], *,
                  tp: str | Sequence[str] = MESH_TP,
                  pp: str | Sequence[str] = MESH_PP) -> Layout:
        """From a mesh's (name, size) dimensions, slowest first: the one named in ``tp`` gives
        tp, in ``pp`` pp; the others are data-parallel and must be adjacent (dims of size 1
        do not count)."""
        dims = list(dims)
        tp, pp = _names(tp), _names(pp)
        sizes = {"tp": 1, "pp": 1}
        kinds: list[str] = []
        for name, size in dims:
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise IdentityError(f"Layout.from_mesh: dimension {name!r} has size {size!r}")
            kind = "tp" if name in tp else "pp" if name in pp else "dp"
            if kind != "dp":
                if sizes[kind] != 1 and size != 1:
                    raise IdentityError(f"Layout.from_mesh: two {kind} dimensions in {dims}")
                sizes[kind] *= size
            if size > 1 and (not kinds or kinds[-1] != kind):
                kinds.append(kind)
        if len(kinds) != len(set(kinds)):
            raise IdentityError(f"Layout.from_mesh: the data-parallel dimensions of {dims} are "
                                "not adjacent (split by tp or pp)")
        order = tuple(d for d in DIMS if d not in kinds) + tuple(kinds)
        return cls(tp=sizes["tp"], pp=sizes["pp"], order=order)

    @classmethod
    def from_mesh(cls, mesh: Any, *, tp: str | Sequence[str] = MESH_TP,
                  pp: str | Sequence[str] = MESH_PP) -> Layout:
        """From a ``torch.distributed.DeviceMesh`` with named dimensions (see ``from_dims``);
        its ranks must be 0..N-1 in row-major order (as ``init_device_mesh`` makes them)."""
        names = getattr(mesh, "mesh_dim_names", None)
        if not names:
            raise IdentityError("Layout.from_mesh: the mesh has no dimension names (build it "
                                "with mesh_dim_names=, e.g. ('dp', 'tp'))")
        layout = cls.from_dims([(str(n), int(mesh.size(i))) for i, n in enumerate(names)],
                               tp=tp, pp=pp)
        ranks = getattr(mesh, "mesh", None)
        if ranks is not None:
            flat = [int(r) for r in ranks.flatten().tolist()]
            if flat != list(range(len(flat))):
                raise IdentityError(f"Layout.from_mesh: the mesh's ranks {flat[:8]} are not "
                                    "0..N-1 in row-major order")
        return layout

    @classmethod
    def from_ranks(cls, world_size: int, *, tp: Sequence[int] | None = None,
                   pp: Sequence[int] | None = None) -> Layout:
        """From the global ranks in this rank's tensor- and pipeline-parallel groups: sizes
        from their lengths, the order from their strides (Megatron's when any fits)."""
        groups = {"tp": sorted(tp or [0]), "pp": sorted(pp or [0])}
        sizes = {"tp": len(groups["tp"]), "pp": len(groups["pp"])}
        per = sizes["tp"] * sizes["pp"]
        if world_size < 1 or world_size % per:
            raise IdentityError(f"Layout.from_groups: world size {world_size} is not a multiple "
                                f"of tp*pp = {per}")
        sizes["dp"] = world_size // per
        for order in permutations(DIMS):
            stride = 1
            strides: dict[str, int] = {}
            for name in reversed(order):
                strides[name] = stride
                stride *= sizes[name]
            if all(all(b - a == strides[k] for a, b in zip(g, g[1:]))
                   for k, g in groups.items()):
                return cls(tp=sizes["tp"], pp=sizes["pp"], order=order)
        raise IdentityError(f"Layout.from_groups: tp ranks {groups['tp'][:8]} and pp ranks "
                            f"{groups['pp'][:8]} are not dimensions of a pp/dp/tp grid of "
                            f"{world_size} ranks")

    @classmethod
    def from_groups(cls, *, tp: Any = None, pp: Any = None) -> Layout:
        """From ``torch.distributed`` process groups (None: that dimension is 1); needs the
        default process group initialised."""
        import torch.distributed as dist

        def ranks(group: Any) -> list[int] | None:
            return None if group is None else list(dist.get_process_group_ranks(group))

        return cls.from_ranks(dist.get_world_size(), tp=ranks(tp), pp=ranks(pp))


@dataclass(frozen=True)
class Identity:
    job_id: str
    rank: int
    world_size: int
    local_rank: int
    node_rank: int
    binding_epoch: int
    launcher: str  # one of LAUNCHERS: where rank and world size came from
    dp_rank: int
    pp_stage: int
    tp_rank: int
    dp_size: int
    pp_size: int
    tp_size: int

    def reporter(self, **kwargs: Any) -> Any:
        """A ``StepReporter`` for this identity (keyword arguments go to it)."""
        from trainguard_sdk.reporter import StepReporter

        return StepReporter(self.job_id, self.rank, self.world_size, dp_rank=self.dp_rank,
                            pp_stage=self.pp_stage, tp_rank=self.tp_rank,
                            binding_epoch=self.binding_epoch, **kwargs)


def _names(names: str | Sequence[str]) -> tuple[str, ...]:
    return (names,) if isinstance(names, str) else tuple(names)


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip(), 10)
    except ValueError:
        raise IdentityError(f"{name}={raw!r}: not an integer") from None
    if value < minimum:
        raise IdentityError(f"{name}={raw!r}: must be >= {minimum}")
    if value > wire.U32_MAX:
        raise IdentityError(f"{name}={raw!r}: must be <= {wire.U32_MAX}")
    return value


def _first(env: Mapping[str, str], *names: str, minimum: int = 0) -> tuple[int | None, str]:
    for name in names:
        value = _int(env, name, minimum)
        if value is not None:
            return value, name
    return None, names[-1]


def _placement(env: Mapping[str, str]) -> tuple[str, int, str, int, str, int, int]:
    """(launcher, rank, rank variable, world size, world variable, local rank, node rank)."""
    rank = _int(env, ENV_RANK)
    if rank is not None:
        world, world_var = _first(env, ENV_WORLD_SIZE, "WORLD_SIZE", "SLURM_NTASKS", minimum=1)
        if world is None:
            raise IdentityError(f"{ENV_RANK} is set but no world size: set {ENV_WORLD_SIZE}")
        local = _first(env, "LOCAL_RANK", "SLURM_LOCALID")[0]
        node = _first(env, "GROUP_RANK", "SLURM_NODEID")[0]
        return "trainguard", rank, ENV_RANK, world, world_var, local or 0, node or 0
    rank = _int(env, "RANK")
    if rank is not None:
        world = _int(env, "WORLD_SIZE", 1)
        if world is None:
            raise IdentityError("RANK is set but WORLD_SIZE is not")
        return ("torchelastic", rank, "RANK", world, "WORLD_SIZE",
                _int(env, "LOCAL_RANK") or 0, _int(env, "GROUP_RANK") or 0)
    rank = _int(env, "SLURM_PROCID")
    if rank is not None:
        world, world_var = _first(env, "SLURM_NTASKS", "SLURM_NPROCS", minimum=1)
        if world is None:
            raise IdentityError("SLURM_PROCID is set but SLURM_NTASKS is not")
        return ("slurm", rank, "SLURM_PROCID", world, world_var,
                _int(env, "SLURM_LOCALID") or 0, _int(env, "SLURM_NODEID") or 0)
    return "single", 0, "rank", 1, "world_size", 0, 0


def _job_id(env: Mapping[str, str]) -> tuple[str, str]:
    for name in (ENV_JOB_ID, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        raw = env.get(name, "").strip()
        if raw and not (name == "TORCHELASTIC_RUN_ID" and raw == UNSET_RUN_ID):
            return raw, name
    raise IdentityError(f"no job id: pass job_id=, or set {ENV_JOB_ID} (or torchrun's "
                        "--rdzv-id, or run under Slurm)")


def epoch_file(env: Mapping[str, str]) -> int | None:
    """The binding epoch in the file ``TRAINGUARD_BINDING_EPOCH_FILE`` names; None when the
    variable is unset or the file does not exist (yet). ``IdentityError`` for a file that
    cannot be read or holds no epoch."""
    path = env.get(ENV_BINDING_EPOCH_FILE, "")
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            raw = fh.read(EPOCH_FILE_MAX + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IdentityError(f"{ENV_BINDING_EPOCH_FILE}={path!r}: cannot be read: "
                            f"{exc.strerror or exc}") from None
    text = raw.decode("ascii", "replace").strip()
    if len(raw) > EPOCH_FILE_MAX or not text.isdigit() or int(text) > wire.U32_MAX:
        raise IdentityError(f"{ENV_BINDING_EPOCH_FILE}={path!r}: not a binding epoch "
                            f"(0..{wire.U32_MAX}; got {raw[:20]!r})")
    return int(text)


def composite_epoch(env: Mapping[str, str]) -> int:
    """The binding epoch from the launchers' restart counters (see the module's docstring)."""
    requeues = min(_int(env, "SLURM_RESTART_COUNT") or 0, REQUEUE_MAX)
    step = _int(env, "SLURM_STEP_ID") or 0
    step = 0 if step >= SLURM_SPECIAL_STEP else min(step, STEP_MAX)
    elastic = min(_int(env, "TORCHELASTIC_RESTART_COUNT") or 0, ELASTIC_MAX)
    return (requeues << REQUEUE_SHIFT) | (step << STEP_SHIFT) | elastic


def identity_from_env(
    env: Mapping[str, str] | None = None,
    *,
    job_id: str | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    binding_epoch: int | None = None,
    layout: Layout | None = None,
) -> Identity:
    """This process's identity (``env`` defaults to ``os.environ``); ``IdentityError`` with
    one line naming the variable or argument when it cannot be made."""
    env = os.environ if env is None else env
    if (rank is None) != (world_size is None):
        raise IdentityError("rank= and world_size=: give both or neither")
    if rank is not None and world_size is not None:
        launcher, rank_var, world_var = "explicit", "rank=", "world_size="
        local = _first(env, "LOCAL_RANK", "SLURM_LOCALID")[0] or 0
        node = _first(env, "GROUP_RANK", "SLURM_NODEID")[0] or 0
    else:
        launcher, rank, rank_var, world_size, world_var, local, node = _placement(env)
    if not isinstance(world_size, int) or world_size < 1:
        raise IdentityError(f"{world_var}: an int >= 1, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise IdentityError(f"{rank_var}: {rank!r} is not in 0..{world_size - 1} "
                            f"({world_var} {world_size})")
    if job_id is None:
        job_id, job_var = _job_id(env)
    else:
        job_var = "job_id="
    try:
        wire.check_job_id(job_id)
    except ValueError:
        raise IdentityError(f"{job_var}: {job_id!r} is not a job id (1..{wire.MAX_JOB_LEN} "
                            f"chars matching {wire.JOB_ID_PATTERN})") from None
    if binding_epoch is None:
        env_epoch = epoch_file(env)
        if env_epoch is None:
            env_epoch = _int(env, ENV_BINDING_EPOCH)
        binding_epoch = composite_epoch(env) if env_epoch is None else env_epoch
    elif not 0 <= binding_epoch <= wire.U32_MAX:
        raise IdentityError(f"binding_epoch=: {binding_epoch!r} is not in 0..{wire.U32_MAX}")
    layout = layout or Layout()
    dp_rank, pp_stage, tp_rank = layout.coordinates(rank, world_size)
    return Identity(job_id=job_id, rank=rank, world_size=world_size, local_rank=local,
                    node_rank=node, binding_epoch=binding_epoch, launcher=launcher,
                    dp_rank=dp_rank, pp_stage=pp_stage, tp_rank=tp_rank,
                    dp_size=layout.dp(world_size), pp_size=layout.pp, tp_size=layout.tp)
