"""The pool of compute units, event-sourced: its state is a pure fold of ``pool.unit`` events.

A unit is a logical slot of compute (here a CPU set on a node; a GPU or a pod elsewhere) in one
of the states spare, bound (job, rank, epoch), draining, fenced, failed. ``reduce`` applies one
event; ``rebuild`` folds a whole log, so a restarted actuator or decision service recovers the
pool from the outcomes topic. ``choose_spare`` picks where a rank goes: only spares usable by the
job (reserved for it, or unreserved), whose data path is reachable, preferring the same node,
then the same switch/rack as the unit being replaced. ``choose_spares`` does it for several
ranks that failed together: one distinct spare each, never one inside a failure domain that
just failed (``failed_domains``), or none at all (the job is never shrunk).

A failure domain is a ``(level, value)`` pair: ``("node", unit.node)`` and one per topology
label (``("rack", "r1")``, ``("drill_node", "node-b")``); the reservation label and a unit's GPU
index are not domains.

Epochs: every binding carries one; ``epochs[(job, rank)]`` is the highest ever bound, so a
report carrying a lower epoch is from a stale replica (see ``fencing.is_stale``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from trainguard.events.envelope import Event
from trainguard.events.payloads import FlatMap, PoolUnit, UnitState

RESERVED_LABEL = "reserved_for"
DOMAIN_LABELS = ("switch", "rack")  # nearest first
NOT_DOMAINS = frozenset({RESERVED_LABEL, "gpu"})  # labels that are no failure domain
Domain = tuple[str, str]  # (level, value): ("node", "n1"), ("rack", "r1"), ("drill_node", "b")


# A kept replica's launch epoch, in its ``pool.unit`` resources once an elastic job's migrate
# bound it at a later epoch (the backend's own record names the launch; the replica is the
# same process, its launcher restarted the workers)
LAUNCH_EPOCH = "launch_epoch"

@dataclass(frozen=True)
class Unit:
    name: str
    state: UnitState
    node: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    job: str | None = None  # the job it is (or was last) bound to
    rank: int | None = None
    epoch: int | None = None
    pid: int | None = None
    resources: FlatMap = field(default_factory=dict)
    quota: bool = True  # tier 1 can set its CPU quota (PoolUnit.quota)

    @property
    def reserved_for(self) -> str | None:
        return self.labels.get(RESERVED_LABEL)


@dataclass(frozen=True)
class PoolState:
    units: Mapping[str, Unit] = field(default_factory=lambda: MappingProxyType({}))
    epochs: Mapping[tuple[str, int], int] = field(default_factory=lambda: MappingProxyType({}))
    # every replica ever bound: pid -> (job, rank, start time), to recognise one that reappears
    launched: Mapping[int, tuple[str, int, float | None]] = field(
        default_factory=lambda: MappingProxyType({}))

    def bound(self, job: str) -> dict[int, Unit]:
        """The job's bound units by rank."""
        return {u.rank: u for u in self.units.values()
                if u.state is UnitState.BOUND and u.job == job and u.rank is not None}

    def epoch(self, job: str, rank: int) -> int:
        return self.epochs.get((job, rank), 0)

    def job_epoch(self, job: str) -> int:
        return max((e for (j, _), e in self.epochs.items() if j == job), default=0)

    def spares_for(self, job: str) -> list[Unit]:
        return sorted((u for u in self.units.values() if u.state is UnitState.SPARE
                       and u.reserved_for in (None, job)), key=lambda u: u.name)


def reduce(state: PoolState, event: Event) -> PoolState:
    """Apply one event; anything but ``pool.unit`` leaves the state as it is."""
    p = event.payload
    if not isinstance(p, PoolUnit):
        return state
    old = state.units.get(p.unit)
    unit = Unit(
        name=p.unit,
        state=p.state,
        node=p.node if p.node is not None else (old.node if old else None),
        labels=MappingProxyType(dict(p.labels)) if p.labels else (old.labels if old else {}),
        job=event.job_id if p.state is UnitState.BOUND or old is None else old.job,
        rank=p.rank if p.state is UnitState.BOUND else None,
        epoch=p.epoch if p.state is UnitState.BOUND else None,
        pid=p.pid if p.state is UnitState.BOUND else None,
        resources=dict(p.resources) if p.resources else (old.resources if old else {}),
        quota=p.quota,
    )
    units = dict(state.units)
    units[p.unit] = unit
    epochs = dict(state.epochs)
    launched = state.launched
    if p.state is UnitState.BOUND and p.rank is not None and p.epoch is not None:
        key = (event.job_id, p.rank)
        epochs[key] = max(epochs.get(key, 0), p.epoch)
        if p.pid is not None:
            created = p.resources.get("create_time")
            launched = MappingProxyType({**launched, p.pid: (
                event.job_id, p.rank,
                float(created) if isinstance(created, int | float) else None)})
    return replace(state, units=MappingProxyType(units), epochs=MappingProxyType(epochs),
                   launched=launched)


def rebuild(events: Iterable[Event]) -> PoolState:
    state = PoolState()
    for event in events:
        state = reduce(state, event)
    return state


@dataclass(frozen=True)
class SpareChoice:
    unit: Unit | None
    reason: str  # why this one, or why none
    storage_blocked: bool = False  # none only because the job's storage is unreachable


@dataclass(frozen=True)
class SparePlan:
    moves: Mapping[int, SpareChoice]  # rank -> its spare; empty when ``missing`` says why
    missing: str | None = None
    storage_blocked: bool = False  # missing only because the job's storage is unreachable


def domains(u: Unit) -> frozenset[Domain]:
    """The failure domains ``u`` is in: its node and its topology labels."""
    out = {(k, v) for k, v in u.labels.items() if k not in NOT_DOMAINS}
    if u.node is not None:
        out.add(("node", u.node))
    return frozenset(out)


def failed_domains(state: PoolState, failed: Iterable[Unit],
                   survivors: Iterable[Unit]) -> frozenset[Domain]:
    """The failure domains that went down with the ``failed`` units of a job (ranks that
    failed together): a domain of a failed unit is down when no unit of a surviving rank is in
    it. Of those, the smallest are kept (a node, not the rack around it: ``domain A inside B``
    when every unit of the pool in A is in B), plus the smallest domain holding every failed
    unit (two nodes of one rack lost together: the rack). Needs two failed units or more: one
    unit failing alone says nothing about its node (a process can die by itself)."""
    down = [domains(u) for u in failed]
    if len(down) < 2:
        return frozenset()
    alive: set[Domain] = set()
    for u in survivors:
        alive |= domains(u)
    candidates = frozenset().union(*down) - alive
    common = frozenset.intersection(*down) - alive
    members = {d: frozenset(u.name for u in state.units.values() if d in domains(u))
               for d in candidates}

    def smallest(ds: frozenset[Domain]) -> frozenset[Domain]:
        return frozenset(d for d in ds if not any(members[o] < members[d] for o in ds))

    return smallest(candidates) | smallest(common)


def format_domains(avoid: Iterable[Domain]) -> list[str]:
    return [f"{k}={v}" for k, v in sorted(avoid)]


def parse_domains(items: Iterable[object]) -> frozenset[Domain]:
    """``format_domains`` read back ("level=value" strings; anything else is skipped)."""
    out: set[Domain] = set()
    for item in items:
        if isinstance(item, str) and "=" in item:
            k, v = item.split("=", 1)
            out.add((k, v))
    return frozenset(out)


def choose_spares(state: PoolState, job: str, replacing: Mapping[int, Unit | None],
                  unreachable: Mapping[str, str],
                  avoid: frozenset[Domain] = frozenset()) -> SparePlan:
    """A distinct spare for every rank in ``replacing`` (rank -> the unit it leaves), none in
    a domain of ``avoid``; all of them or none (``missing`` says why): a job is never shrunk
    and never half moved. Ranks choose in rank order, each the nearest to its own old unit."""
    taken: set[str] = set()
    moves: dict[int, SpareChoice] = {}
    for rank in sorted(replacing):
        choice = choose_spare(state, job, replacing[rank], unreachable, avoid, taken)
        if choice.unit is None:
            need = len(replacing)
            return SparePlan({}, choice.reason if need == 1 else
                             f"{need} ranks {sorted(replacing)} need a spare each; found "
                             f"{len(moves)} ({choice.reason}); nothing moved",
                             choice.storage_blocked)
        moves[rank] = choice
        taken.add(choice.unit.name)
    return SparePlan(moves)


def choose_spare(state: PoolState, job: str, replacing: Unit | None,
                 unreachable: Mapping[str, str], avoid: frozenset[Domain] = frozenset(),
                 taken: Iterable[str] = ()) -> SpareChoice:
    """The spare a rank of ``job`` should move to, or none with the reason.

    ``unreachable`` maps unit name -> why it cannot serve the job: the job's storage cannot be
    reached from it, or (Slurm, when the job names its agent socket) the node's agent does not
    answer (probed at the edge by the backend before calling this). ``avoid``: failure domains
    that just failed (no spare inside one is given); ``taken``: spares already given to other
    ranks.
    """
    gone = set(taken)
    candidates = [u for u in state.spares_for(job) if u.name not in gone]
    if not candidates:
        return SpareChoice(None, f"no spare unit in the pool for job {job} "
                                 f"(reserved for it or unreserved)")
    usable = [u for u in candidates if not domains(u) & avoid and u.name not in unreachable]
    if not usable:
        def why(u: Unit) -> str:
            down = domains(u) & avoid
            return (f"in the failed domain {', '.join(format_domains(down))}" if down
                    else unreachable[u.name])
        outside = [u for u in candidates if not domains(u) & avoid]
        what = ("no spare can reach the job's storage or its agent" if outside
                else "no spare outside the failed domain(s) " + ", ".join(format_domains(avoid)))
        return SpareChoice(None, f"{what} ({'; '.join(f'{u.name}: {why(u)}' for u in candidates)})",
                           storage_blocked=bool(outside))

    def rank_of(u: Unit) -> tuple[int, tuple[bool, ...], str]:
        reserved = 0 if u.reserved_for == job else 1
        return (reserved, _distance(u, replacing), u.name)

    best = min(usable, key=rank_of)
    shared = _shared(best, replacing)
    where = ("same " + " and ".join(shared)) if shared else "another domain"
    reserved = "reserved for the job" if best.reserved_for == job else "unreserved"
    return SpareChoice(best, f"{best.name}: {where}, {reserved}, probed (storage reachable)")


LEVELS = ("node", *DOMAIN_LABELS)


def _value(u: Unit, level: str) -> str | None:
    return u.node if level == "node" else u.labels.get(level)


def _shared(u: Unit, ref: Unit | None) -> list[str]:
    if ref is None:
        return []
    return [lvl for lvl in LEVELS
            if _value(u, lvl) is not None and _value(u, lvl) == _value(ref, lvl)]


def _distance(u: Unit, ref: Unit | None) -> tuple[bool, ...]:
    """Per level, nearest first (node, switch, rack): False where ``u`` shares it with ``ref``;
    compared lexicographically, so the same node wins, then the same switch, then the rack."""
    shared = set(_shared(u, ref))
    return tuple(lvl not in shared for lvl in LEVELS)
