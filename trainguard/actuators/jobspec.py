"""A job spec for the local backend: the ranks' command line, the units (CPU sets) of the pool,
which unit each rank starts on, and where the job's checkpoints live.

```yaml
job_id: demo-job
world_size: 4
node: demo-node                # this machine's name in events (default: hostname)
ckpt_dir: /var/lib/trainguard/ckpt/demo-job
grace_s: 5                     # SIGTERM -> SIGKILL grace when fencing
command: [python, -m, trainguard.workload.ddp, --job-id, "{job_id}", --rank, "{rank}",
          --world-size, "{world_size}", --master-addr, 127.0.0.1, --master-port, "{port}",
          --ckpt-dir, "{ckpt_dir}", --steps, "400"]
env: {TRAINGUARD_AGENT_SOCKET: /run/trainguard/agent.sock}
units:
  - {name: u0, cpus: [0], rank: 0, labels: {rack: r1}}
  - {name: u4, cpus: [1], labels: {rack: r1, reserved_for: demo-job}}   # a spare
```

Placeholders in ``command``: ``{job_id} {rank} {world_size} {port} {ckpt_dir} {epoch}
{unit} {master_addr}``; ``{port}`` is a fresh free local port per launch of the process group;
``{master_addr}`` is the ``address`` of the unit rank 0 is placed on at this launch (where the
ranks meet: it moves with rank 0 when a migration moves rank 0), and needs an ``address`` on
every unit (``- {name: tgn1, address: 10.0.0.11}``; a unit on another host). In ``env``
values, ``{unit}`` (a node-local path per unit, e.g. ``/run/tg/{unit}/agent.sock`` where
nodes share a file system); nothing else in them is expanded.

``elastic: true``: ``command`` is a per-unit launcher that re-forms the process group by
itself (torchrun with c10d rendezvous at a store off the units, ``--max-restarts`` >= 1). A
migrate then fences and relaunches only the moved ranks' replicas: the new one joins the
launcher's rendezvous, and the other units' launchers restart their workers into the new round
from the last valid checkpoint, keeping their replicas (bound at the group's new epoch in
place). A resume, and a command an actuator restart finds in flight, still restart every
rank. ``{rank}`` is the unit's slot in the job (``TRAINGUARD_RANK``, what reports and
verdicts name), not the process-group rank the rendezvous assigns; ``{port}`` and
``{master_addr}`` are refused (a relaunched unit must find the survivors where they are: the
rendezvous endpoint is fixed).
The job's binding epoch is kept in ``<ckpt_dir>/.trainguard-binding-epoch``
(``TRAINGUARD_BINDING_EPOCH_FILE`` in the ranks' environment): a worker its launcher restarts
reads the epoch the group was re-formed at there (``trainguard_sdk.identity``).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from trainguard_sdk.identity import ENV_BINDING_EPOCH_FILE

from trainguard.configfile import ConfigFileError, finite_in, load_yaml, show
from trainguard.events.envelope import JobId, Subject


class JobSpecError(ValueError):
    pass


MASTER_ADDR = "{master_addr}"
EPOCH_FILE = ".trainguard-binding-epoch"  # an elastic job's, in its checkpoint directory


_JOB_ID: TypeAdapter[str] = TypeAdapter(JobId)
MAX_WORLD = 65_536
MAX_CPU = 65_535
MAX_GRACE_S = 3_600.0


def _contract(where: str, name: str, value: str, check: Any) -> None:
    """``value`` passes the event contract's validator for the field it will travel in."""
    try:
        check(value)
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"]
        raise JobSpecError(f"{where}: field {name!r}: breaks the event contract: {reason} "
                           f"(got {show(value)})") from None


def _text(where: str, name: str, value: Any) -> str:
    """A string an argv, environment or path can carry (no NUL byte)."""
    if not isinstance(value, str) or "\0" in value:
        raise JobSpecError(f"{where}: field {name!r}: a string without NUL bytes "
                           f"(got {show(value)})")
    return value


@dataclass(frozen=True)
class UnitSpec:
    name: str
    cpus: tuple[int, ...]
    rank: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    address: str | None = None  # where the other ranks reach a rank on it ({master_addr})


@dataclass(frozen=True)
class JobSpec:
    job_id: str
    world_size: int
    command: tuple[str, ...]
    units: tuple[UnitSpec, ...]
    ckpt_dir: Path
    node: str = field(default_factory=socket.gethostname)
    grace_s: float = 5.0
    env: Mapping[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    preload: tuple[str, ...] = ()  # modules a warm launcher imports once (command: python -m)
    elastic: bool = False  # the command re-forms its group: a migrate relaunches moved ranks

    def unit(self, name: str) -> UnitSpec:
        for u in self.units:
            if u.name == name:
                return u
        raise JobSpecError(f"units: no unit named {name!r}")

    def env_for(self, unit: str) -> dict[str, str]:
        """The ranks' extra environment on ``unit``: ``env`` with ``{unit}`` in its values
        replaced by the unit's name (what the probe of a spare reads too); an elastic job's
        epoch file."""
        out = {k: v.replace("{unit}", unit) for k, v in self.env.items()}
        if self.epoch_file is not None:
            out[ENV_BINDING_EPOCH_FILE] = str(self.epoch_file)
        return out

    @property
    def epoch_file(self) -> Path | None:
        """Where an elastic job's binding epoch is written for its workers (None: not
        elastic; the epoch is the launch's, in ``TRAINGUARD_BINDING_EPOCH``)."""
        return self.ckpt_dir / EPOCH_FILE if self.elastic else None

    @property
    def meets_at_master_addr(self) -> bool:
        """Does the command use ``{master_addr}`` (so every unit needs an ``address``)?"""
        return any(MASTER_ADDR in part for part in self.command)

    def master_addr(self, placement: Mapping[int, str]) -> str | None:
        """``{master_addr}`` for a launch with ``placement`` (rank -> unit): the address of
        rank 0's unit; None when it has none."""
        return self.unit(placement[0]).address if 0 in placement else None

    def argv(self, rank: int, epoch: int, port: int, unit: str,
             master_addr: str | None = None) -> list[str]:
        if master_addr is None and self.meets_at_master_addr:
            raise JobSpecError(f"field 'command': {MASTER_ADDR}: rank 0's unit has no "
                               "'address'")
        values = {"job_id": self.job_id, "rank": rank, "world_size": self.world_size,
                  "port": port, "ckpt_dir": str(self.ckpt_dir), "epoch": epoch, "unit": unit,
                  "master_addr": master_addr}
        try:
            return [part.format(**values) for part in self.command]
        except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
            raise JobSpecError(f"field 'command': bad placeholder ({exc})") from None


def load_job_spec(path: Path) -> JobSpec:
    try:
        doc = load_yaml(path)
    except ConfigFileError as exc:
        raise JobSpecError(str(exc)) from None
    return parse_job_spec(doc, str(path))


def parse_job_spec(doc: Any, where: str = "job spec") -> JobSpec:
    if not isinstance(doc, dict):
        raise JobSpecError(f"{where}: must be a mapping")
    known = {"job_id", "world_size", "command", "units", "ckpt_dir", "node", "grace_s", "env",
             "log_dir", "preload", "elastic"}
    extra = sorted(map(str, set(doc) - known))
    if extra:
        raise JobSpecError(f"{where}: field {extra[0]!r}: unknown (known: {sorted(known)})")

    def need(name: str, typ: type) -> Any:
        value = doc.get(name)
        if not isinstance(value, typ) or isinstance(value, bool):
            raise JobSpecError(f"{where}: field {name!r}: required, a {typ.__name__} "
                               f"(got {show(value)})")
        return value

    job_id = need("job_id", str)
    _contract(where, "job_id", job_id, _JOB_ID.validate_python)
    world = need("world_size", int)
    if not 1 <= world <= MAX_WORLD:
        raise JobSpecError(f"{where}: field 'world_size': must be from 1 to {MAX_WORLD} "
                           f"(got {world})")
    command = need("command", list)
    if not command:
        raise JobSpecError(f"{where}: field 'command': a non-empty list of strings")
    for i, part in enumerate(command):
        _text(where, f"command[{i}]", part)
    units = tuple(_unit(u, i, where) for i, u in enumerate(need("units", list)))
    names = [u.name for u in units]
    if len(set(names)) != len(names):
        raise JobSpecError(f"{where}: field 'units': unit names must be unique ({names})")
    ranks = sorted(u.rank for u in units if u.rank is not None)
    if ranks != list(range(world)):
        raise JobSpecError(f"{where}: field 'units': ranks 0..{world - 1} must each start on "
                           f"exactly one unit (got {ranks})")
    env = doc.get("env") or {}
    if not isinstance(env, dict):
        raise JobSpecError(f"{where}: field 'env': a mapping of strings (got {show(env)})")
    for k, v in env.items():
        if not isinstance(k, str) or not k or "=" in k or "\0" in k:
            raise JobSpecError(f"{where}: field 'env': a variable name (got {show(k)})")
        _text(where, f"env.{k}", v)
    grace = doc.get("grace_s", 5.0)
    if not finite_in(grace, 0, MAX_GRACE_S):
        raise JobSpecError(f"{where}: field 'grace_s': a number from 0 to {MAX_GRACE_S:g} "
                           f"(got {show(grace)})")
    preload = doc.get("preload") or []
    if not isinstance(preload, list) or not all(isinstance(m, str) for m in preload):
        raise JobSpecError(f"{where}: field 'preload': a list of module names "
                           f"(got {show(preload)})")
    if preload and (len(command) < 3 or command[0] != "python" or command[1] != "-m"):
        raise JobSpecError(f"{where}: field 'preload': needs a command of the form "
                           f"[python, -m, MODULE, ...] (got {command[:3]})")
    ckpt_dir = _text(where, "ckpt_dir", need("ckpt_dir", str))
    node = doc.get("node") or socket.gethostname()
    _contract(where, "node", _text(where, "node", node), lambda v: Subject(node=v))
    log_dir = doc.get("log_dir")
    if log_dir is not None:
        _text(where, "log_dir", log_dir)
    elastic = doc.get("elastic", False)
    if not isinstance(elastic, bool):
        raise JobSpecError(f"{where}: field 'elastic': true or false (got {show(elastic)})")
    fixed = [p for p in ("{port}", MASTER_ADDR) if any(p in part for part in command)]
    if elastic and fixed:
        raise JobSpecError(f"{where}: field 'command': {fixed[0]} with 'elastic': a relaunched "
                           "unit must join the survivors' rendezvous, so its endpoint is "
                           "fixed in the command")
    spec = JobSpec(job_id=job_id, world_size=world, command=tuple(command), units=units,
                   preload=tuple(preload), ckpt_dir=Path(ckpt_dir), node=node,
                   grace_s=float(grace), env=dict(env),
                   log_dir=Path(log_dir) if log_dir else None, elastic=elastic)
    no_address = [u.name for u in units if u.address is None]
    if no_address and spec.meets_at_master_addr:
        raise JobSpecError(f"{where}: field 'units': {MASTER_ADDR} in 'command' needs an "
                           f"'address' on every unit (none on {no_address[0]!r})")
    try:  # a placeholder that cannot be filled fails now, not at the first launch
        spec.argv(0, 0, 1, units[0].name, units[0].address)
    except JobSpecError as exc:
        raise JobSpecError(f"{where}: {exc}") from None
    return spec


def _unit(doc: Any, i: int, where: str) -> UnitSpec:
    here = f"{where}: field 'units[{i}]"
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise JobSpecError(f"{here}.name': required string (got {show(doc)})")
    name = doc["name"]
    _contract(where, f"units[{i}].name", name, lambda v: Subject(unit=v))
    if "/" in name or "\0" in name or name in (".", ".."):
        raise JobSpecError(f"{here}.name': no '/' or NUL, not . or .. (got {show(name)})")
    cpus = doc.get("cpus", [])
    if not isinstance(cpus, list) or not all(
            isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= MAX_CPU for c in cpus):
        raise JobSpecError(f"{here}.cpus': a list of CPU numbers 0..{MAX_CPU} "
                           f"(got {show(cpus)})")
    rank = doc.get("rank")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool) or rank < 0):
        raise JobSpecError(f"{here}.rank': an integer >= 0 (got {show(rank)})")
    labels = doc.get("labels") or {}
    if not isinstance(labels, dict) or not all(
            isinstance(v, str | int | float) and not isinstance(v, bool)
            for v in labels.values()):
        raise JobSpecError(f"{here}.labels': a mapping of strings (got {show(labels)})")
    address = doc.get("address")
    if address is not None and (not isinstance(address, str) or not address
                                or any(c.isspace() or c == "\0" for c in address)):
        raise JobSpecError(f"{here}.address': a host name or IP address (got {show(address)})")
    return UnitSpec(name, tuple(cpus), rank, {str(k): str(v) for k, v in labels.items()},
                    address)


# torch._dynamo: DistributedDataParallel imports the compiler stack (dynamo, inductor, sympy;
# ~900 modules) lazily on construction: ~4 s of CPU per rank per start unless preloaded.
DDP_PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo",
               "trainguard.workload.model", "trainguard.workload.data",
               "trainguard_sdk.checkpoint.manager", "trainguard_sdk.ddp")


def ddp_job_doc(job_id: str, *, world_size: int, spares: int, ckpt_dir: Path, node: str,
                agent_socket: Path | None, progress_dir: Path | None = None,
                steps: int = 100_000, ckpt_every: int = 10, step_ms: float = 100.0,
                grace_s: float = 3.0, cpus: int = 2, warm: bool = True,
                allow_tmp_ckpt: bool = False, threads_per_rank: int = 1,
                log_dir: Path | None = None) -> dict[str, Any]:
    """A job spec document for the reference DDP workload (gloo on CPU): ``world_size`` ranks
    on units ``u0..``, ``spares`` spare units reserved for the job, all on this node, CPUs
    assigned round-robin. For demos, benches and tests; write it with ``yaml.safe_dump``."""
    command = ["python", "-m", "trainguard.workload.ddp", "--job-id", "{job_id}", "--rank",
               "{rank}", "--world-size", "{world_size}", "--master-addr", "127.0.0.1",
               "--master-port", "{port}", "--ckpt-dir", "{ckpt_dir}", "--steps", str(steps),
               "--ckpt-every", str(ckpt_every), "--seed", "7", "--step-ms", str(step_ms),
               "--timeout-s", "20", "--cpu"]
    if allow_tmp_ckpt:
        command.append("--allow-tmp-ckpt")
    if progress_dir is not None:
        command += ["--progress-file", str(progress_dir / "progress-{rank}.jsonl")]
    units: list[dict[str, Any]] = [
        {"name": f"u{r}", "cpus": [r % cpus], "rank": r, "labels": {"rack": "r1"}}
        for r in range(world_size)]
    units += [{"name": f"spare{i}" if spares > 1 else "spare",
               "cpus": [(world_size + i) % cpus],
               "labels": {"rack": "r1", "reserved_for": job_id}} for i in range(spares)]
    doc: dict[str, Any] = {"job_id": job_id, "world_size": world_size, "node": node,
                           "ckpt_dir": str(ckpt_dir), "grace_s": grace_s, "command": command,
                           "units": units, "preload": list(DDP_PRELOAD) if warm else [],
                           # one intra-op thread per rank: a unit is a CPU set, and more
                           # threads than its CPUs spin against each other
                           "env": {"OMP_NUM_THREADS": str(threads_per_rank)}}
    if agent_socket is not None:
        doc["env"]["TRAINGUARD_AGENT_SOCKET"] = str(agent_socket)
    if log_dir is not None:
        doc["log_dir"] = str(log_dir)
    return doc
