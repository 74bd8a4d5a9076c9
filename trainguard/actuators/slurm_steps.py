"""What the Slurm backend records and proves about the steps it submits: pure.

A replica on Slurm is one job step of the allocation, started by ``srun --jobid``, running on
one node (one task: the node's torchrun agent, or a single rank). Its identity is its step
name, which carries the trainguard job, rank and binding epoch (``tg.<job>.r<rank>.e<epoch>``),
plus the step id Slurm gave it (``<job id>.<step>``). The backend writes a ``slurm_step``
record to its journal *before* ``srun`` (the step may not exist yet: ``step_id`` empty) and
again once Slurm lists the step (``step_id`` set). Fencing acts on a step only when it is one of
those records, and only on the step id the record names: a step the log names but the journal
does not is never cancelled.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Literal

from trainguard.actuators.slurm_view import NodeHealth, SlurmNode, SlurmPool, SlurmStep

_NAME = re.compile(r"^tg\.(?P<job>.+)\.r(?P<rank>\d+)\.e(?P<epoch>\d+)$")


def step_name(job: str, rank: int, epoch: int) -> str:
    return f"tg.{job}.r{rank}.e{epoch}"


def parse_step_name(name: str) -> tuple[str, int, int] | None:
    """``tg.<job>.r<rank>.e<epoch>`` → (job, rank, epoch); another name → None."""
    m = _NAME.match(name)
    if m is None:
        return None
    return m.group("job"), int(m.group("rank")), int(m.group("epoch"))


@dataclass(frozen=True)
class StepRecord:
    """One step this backend submitted (``step_id`` empty until Slurm listed it)."""

    job: str
    rank: int
    epoch: int
    unit: str          # the Slurm node
    alloc: int         # the allocation's Slurm job id
    name: str
    srun_pid: int
    step_id: str = ""
    command_id: str | None = None
    kind: Literal["slurm_step"] = "slurm_step"

    def to_record(self) -> dict[str, object]:
        return asdict(self)


def step_record_of(rec: Mapping[str, object]) -> StepRecord | None:
    """The step a journal record describes, or None (another kind or bad fields)."""
    if rec.get("kind") != "slurm_step":
        return None
    ints = [rec.get(k) for k in ("rank", "epoch", "alloc", "srun_pid")]
    strs = [rec.get(k) for k in ("job", "unit", "name")]
    step_id, cid = rec.get("step_id", ""), rec.get("command_id")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints) \
            or not all(isinstance(v, str) and v for v in strs) \
            or not isinstance(step_id, str) or not (cid is None or isinstance(cid, str)):
        return None
    rank, epoch, alloc, pid = (int(str(v)) for v in ints)
    job, unit, name = (str(v) for v in strs)
    if parse_step_name(name) != (job, rank, epoch):
        return None
    return StepRecord(job, rank, epoch, unit, alloc, name, pid, step_id,
                      cid if isinstance(cid, str) else None)


def latest(records: Iterable[StepRecord], job: str) -> dict[tuple[int, int], StepRecord]:
    """Per (rank, epoch) the newest record of ``job`` (the one with the step id wins)."""
    out: dict[tuple[int, int], StepRecord] = {}
    for r in records:
        if r.job != job:
            continue
        key = (r.rank, r.epoch)
        if key not in out or r.step_id or not out[key].step_id:
            out[key] = r
    return out


LIVE_STATES = frozenset({"RUNNING", "PENDING", "CONFIGURING", "COMPLETING", "SUSPENDED"})


def released(step: SlurmStep | None, allocation: Iterable[str],
             nodes: Iterable[SlurmNode]) -> bool:
    """Has Slurm given the step up? Not listed any more; or every node it ran on is DOWN and
    no longer part of the job's allocation. (A node lost for good cannot ack the kill, so
    22.05 keeps listing its step ``RUNNING`` after "Removing failed node ... from JobId":
    the node is out of the job, its resources released, and nothing of the step can come
    back on it without a new registration, which a DOWN node must be resumed for.)"""
    if step is None:
        return True
    alloc = set(allocation)
    health = {n.name: n.health for n in nodes}
    return bool(step.nodes) and all(n not in alloc and health.get(n) is NodeHealth.DOWN
                                    for n in step.nodes)


def proven_live(records: Mapping[tuple[int, int], StepRecord],
                steps: Iterable[SlurmStep], allocation: Iterable[str] | None = None,
                nodes: Iterable[SlurmNode] = ()) -> list[StepRecord]:
    """The recorded steps Slurm lists alive, under the id and name the record gives (and,
    with ``allocation``, not given up by Slurm: see ``released``)."""
    listed = {s.step_id: s for s in steps}
    alloc = None if allocation is None else tuple(allocation)
    node_list = tuple(nodes)
    out = []
    for rec in records.values():
        step = listed.get(rec.step_id) if rec.step_id else None
        if step is None or step.name != rec.name or step.state.upper() not in LIVE_STATES:
            continue
        if alloc is not None and released(step, alloc, node_list):
            continue
        out.append(rec)
    return sorted(out, key=lambda r: (r.rank, r.epoch))


def find_step(steps: Iterable[SlurmStep], alloc: int, name: str) -> SlurmStep | None:
    """The step of allocation ``alloc`` named ``name`` (the newest if Slurm lists several)."""
    found = [s for s in steps if s.job_id == alloc and s.name == name]
    return max(found, key=lambda s: _step_no(s.step_id)) if found else None


def _step_no(step_id: str) -> int:
    tail = step_id.split(".", 1)[1] if "." in step_id else ""
    return int(tail) if tail.isdigit() else -1


FenceStart = Literal["cancel", "down_first"]


def fence_start(node: SlurmNode | None) -> FenceStart:
    """How fencing a step on ``node`` begins: a node Slurm already sees lost (down, not
    responding, or unknown to it) cannot confirm a cancel, so it is set DOWN first (Slurm then
    gives up on that node's part of the step itself); a healthy one gets ``scancel``."""
    if node is None or node.health is NodeHealth.DOWN:
        return "down_first"
    return "cancel"


@dataclass(frozen=True)
class PoolNode:
    """One node of the pool: Slurm's view joined with what its agent says."""

    name: str
    address: str
    role: Literal["allocated", "spare"]
    health: NodeHealth
    agent: bool        # its trainguard agent was heard recently
    reason: str

    @property
    def placeable(self) -> bool:
        return self.health is NodeHealth.USABLE and self.agent


def join_pool(view: SlurmPool, heard: Iterable[str] | None) -> list[PoolNode]:
    """The allocation and its spares (Slurm's view) joined with the nodes whose agents were
    heard (``None``: no agent data, every node counts as heard). A node is placeable only when
    both Slurm finds it usable and its agent speaks."""
    agents = None if heard is None else set(heard)
    out = []
    for role, nodes in (("allocated", view.allocation), ("spare", view.spares)):
        for n in nodes:
            out.append(PoolNode(n.name, n.address, "allocated" if role == "allocated"
                                else "spare", n.health, agents is None or n.name in agents,
                                n.reason))
    return out


# run by ``python3`` in a probe step: connects a datagram socket to the agent's step socket
# (what a rank's reports go through): ENOENT/ECONNREFUSED when no agent holds it
_AGENT_PROBE = ("import socket,sys\n"
                "s=socket.socket(socket.AF_UNIX,socket.SOCK_DGRAM)\n"
                "try:\n s.connect(sys.argv[1])\n"
                "except OSError as e:\n"
                " sys.exit('agent socket %s: %s' % (sys.argv[1], e.strerror or e))\n")


def reach_script(ckpt_dir: str, unit: str, agent_socket: str | None) -> str:
    """The ``sh -c`` script of a probe step on ``unit``: the job's checkpoint directory takes
    a file, and (when the job names its agent socket: ``JobSpec.env_for``, literal, as the
    ranks get it) the node's agent answers on it, as a rank would report through it."""
    probe = shlex.quote(f"{ckpt_dir}/.reach-{unit}")
    script = f"touch {probe} && rm -f {probe}"
    if agent_socket:
        script += f" && python3 -c {shlex.quote(_AGENT_PROBE)} {shlex.quote(agent_socket)}"
    return script
