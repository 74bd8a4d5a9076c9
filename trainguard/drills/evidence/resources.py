"""Resource evidence: the old replica stopped before the new one started; never two live
replicas of one rank; the old unit, sockets and temp files released; the new binding kept the
quota and permissions. Pure functions of a ``JobLog`` and the runner's ``Artifacts``."""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping

from trainguard.actuators.pool import LAUNCH_EPOCH
from trainguard.drills.evidence.log import JobLog
from trainguard.drills.evidence.model import Artifacts, Check, Status
from trainguard.events.envelope import Event
from trainguard.events.payloads import (
    Heartbeat,
    PoolUnit,
    ReplicaRefused,
    StopProof,
    UnitState,
)

Sighting = tuple[int, int, int, str]  # rank, pid, event time, event id


def _check(name: str, status: Status, detail: str, events: list[Event] | None = None) -> Check:
    events = events or []
    return Check("resources", name, status, detail, tuple(e.event_id for e in events),
                 tuple(e.event_time for e in events))


def _new_bindings(log: JobLog) -> tuple[list[Event], int] | str:
    fault = log.fault_start()
    if fault is None:
        return "no injection start on the log"
    bound = [e for e in log.unit_events(UnitState.BOUND) if e.event_time >= fault]
    before = [e for e in log.unit_events(UnitState.BOUND) if e.event_time < fault]
    old_epoch = max((e.payload.epoch or 0 for e in before
                     if isinstance(e.payload, PoolUnit)), default=0)
    return bound, old_epoch


def old_stopped_before_new(log: JobLog) -> Check:
    name = "old_replica_stopped_before_new_started"
    found = _new_bindings(log)
    if isinstance(found, str):
        return _check(name, Status.UNEXPLAINED, found)
    bound, _ = found
    if not bound:
        return _check(name, Status.NOT_APPLICABLE, "no replica was bound after the fault")
    all_bound = log.unit_events(UnitState.BOUND)
    fenced = log.unit_events(UnitState.FENCED)
    bad: list[str] = []
    cited: list[Event] = []
    kept = 0
    for b in bound:
        p = b.payload
        assert isinstance(p, PoolUnit)
        prev = [e for e in all_bound if isinstance(e.payload, PoolUnit)
                and e.payload.rank == p.rank and (e.payload.epoch or 0) < (p.epoch or 0)]
        if not prev:
            bad.append(f"rank {p.rank} epoch {p.epoch}: no earlier binding on the log")
            continue
        old = max(prev, key=lambda e: e.event_time)
        op = old.payload
        assert isinstance(op, PoolUnit)
        if LAUNCH_EPOCH in p.resources and (p.unit, p.pid) == (op.unit, op.pid):
            # an elastic job's replica kept through a migrate: the same launcher, which
            # restarted its workers; the old epoch's must have stopped reporting first
            kept += 1
            cited += [old, b]
            why = _workers_overlap(log, p.rank, op.epoch, p.epoch)
            if why:
                bad.append(why)
            continue
        fence = [e for e in fenced if isinstance(e.payload, PoolUnit)
                 and e.payload.rank == p.rank and e.payload.epoch == op.epoch
                 and e.payload.pid == op.pid]
        cited += [old, b]
        if not fence:
            bad.append(f"rank {p.rank}: epoch {op.epoch} replica (pid {op.pid}, unit {op.unit}) "
                       f"was never fenced, yet epoch {p.epoch} was bound on {p.unit}")
            continue
        f = min(fence, key=lambda e: e.event_time)
        cited.append(f)
        if f.event_time > b.event_time:
            bad.append(f"rank {p.rank}: epoch {p.epoch} bound at {b.event_time} before epoch "
                       f"{op.epoch} (pid {op.pid}) was fenced at {f.event_time}")
    if bad:
        return _check(name, Status.FAIL, "; ".join(bad), cited)
    detail = (f"{len(bound) - kept} new binding(s), each after the previous replica of its "
              "rank was fenced (stopped and confirmed dead)")
    if kept:
        detail += (f"; {kept} replica(s) kept at the new epoch (an elastic job's launchers, "
                   "which restarted their workers: every report of the old epoch came before "
                   "the first of the new)")
    return _check(name, Status.PASS, detail, cited)


def _workers_overlap(log: JobLog, rank: int | None, old: int | None, new: int | None
                     ) -> str | None:
    """A kept replica's workers: did one of the old epoch report after the new one began?"""
    olds = [s.time for s in log.steps if s.rank == rank and s.epoch == old]
    news = [s.time for s in log.steps if s.rank == rank and s.epoch == new]
    if olds and news and max(olds) > min(news):
        return (f"rank {rank}: kept through the migrate, yet a worker of epoch {old} reported "
                f"at {max(olds)}, after epoch {new}'s first report at {min(news)}")
    return None


def no_duplicate_replica(log: JobLog, artifacts: Artifacts | None) -> Check:
    """Per rank, the spans [first, last report] of different processes must not overlap,
    except where the later report of the older one was refused as stale; and the process
    census (when taken) never saw two live processes of one rank."""
    name = "no_duplicate_replica"
    seen: list[Sighting] = [(s.rank, s.pid, s.time, s.event_id) for s in log.steps
                            if s.pid is not None]
    for e in log.heartbeats:
        if isinstance(e.payload, Heartbeat) and e.payload.pid is not None:
            seen.append((e.payload.rank, e.payload.pid, e.event_time, e.event_id))
    if not seen:
        return _check(name, Status.UNEXPLAINED, "no step report or heartbeat carries a pid")
    spans: dict[tuple[int, int], list[Sighting]] = defaultdict(list)
    for item in seen:
        spans[(item[0], item[1])].append(item)
    refused = {(e.payload.rank, e.payload.pid): e for e in log.refused
               if isinstance(e.payload, ReplicaRefused)}
    bad: list[str] = []
    notes: list[str] = []
    ids: list[str] = []
    times: list[int] = []

    def cite(*items: Sighting | Event) -> None:
        for it in items:
            if isinstance(it, Event):
                ids.append(it.event_id)
                times.append(it.event_time)
            else:
                ids.append(it[3])
                times.append(it[2])

    by_rank: dict[int, list[list[Sighting]]] = defaultdict(list)
    for (rank, _pid), items in spans.items():
        items.sort(key=lambda x: x[2])
        by_rank[rank].append(items)
    for rank, runs in sorted(by_rank.items()):
        runs.sort(key=lambda r: r[0][2])
        for a, b in itertools.pairwise(runs):
            if a[-1][2] < b[0][2]:
                continue
            apid, bpid = a[0][1], b[0][1]
            ref = refused.get((rank, apid))
            if ref is not None:
                cite(a[-1], b[0], ref)
                if any(x[2] > ref.event_time for x in a):
                    bad.append(f"rank {rank}: pid {apid} kept reporting after it was refused")
                else:
                    notes.append(f"rank {rank}: stale pid {apid} reported while pid {bpid} "
                                 "ran, and was refused")
                continue
            cite(a[-1], b[0])
            bad.append(f"rank {rank}: pids {apid} and {bpid} both reported between "
                       f"{b[0][2]} and {a[-1][2]}")
    if artifacts is not None and artifacts.max_live_replicas is not None:
        many = {r: n for r, n in artifacts.max_live_replicas.items() if n > 1}
        if many:
            bad.append(f"process census saw more than one live process for ranks {many}")
    if bad:
        return Check("resources", name, Status.FAIL, "; ".join(bad), tuple(ids), tuple(times))
    census = "" if artifacts is None or artifacts.max_live_replicas is None else \
        "; process census: at most one live process per rank at every sample"
    for runs in by_rank.values():
        for run in runs:
            cite(run[0], run[-1])
    return Check("resources", name, Status.PASS,
                 f"{len(spans)} processes over {len(by_rank)} ranks; their reporting spans "
                 "never overlap per rank" + census + (f" ({'; '.join(notes)})" if notes else ""),
                 tuple(ids), tuple(times))


def _stop_proven(p: PoolUnit) -> bool:
    """Its backend proved the fenced replica stopped: the typed ``stopped`` (any backend: the
    local process confirmed dead, the Slurm step confirmed gone), or, on a log from before
    ``stopped`` existed, the local backend's ``released`` line for its pid."""
    if p.stopped is not None:
        return p.stopped is not StopProof.NOT_OURS
    proc = [r for r in p.released if r.startswith(f"process {p.pid} ")]
    return any("confirmed dead" in r or "already gone" in r for r in proc)


def old_resources_released(log: JobLog, artifacts: Artifacts | None) -> Check:
    name = "old_resources_released"
    found = _new_bindings(log)
    if isinstance(found, str):
        return _check(name, Status.UNEXPLAINED, found)
    fault = log.fault_start() or 0
    fenced = [e for e in log.unit_events(UnitState.FENCED) if e.event_time >= fault]
    leftovers = list(artifacts.temp_files) if artifacts is not None else []
    if not fenced:
        if found[0]:
            return _check(name, Status.FAIL, "replicas were bound after the fault but none "
                          "was fenced")
        if leftovers:
            return _check(name, Status.FAIL, f"temp files left in the checkpoint directory: "
                          f"{leftovers[:5]}")
        return _check(name, Status.NOT_APPLICABLE, "nothing was fenced (no restart)")
    bad: list[str] = []
    for e in fenced:
        p = e.payload
        assert isinstance(p, PoolUnit)
        if not _stop_proven(p):
            bad.append(f"unit {p.unit} (rank {p.rank}, pid {p.pid}): the replica is not "
                       f"confirmed stopped (stopped {p.stopped}, released {p.released})")
        if any("not removed" in r for r in p.released):
            bad.append(f"unit {p.unit}: {[r for r in p.released if 'not removed' in r]}")
    if artifacts is None or not artifacts.collected:
        return _check(name, Status.UNEXPLAINED, "the checkpoint directory was not inspected "
                      "for leftover temp files", fenced)
    if leftovers:
        bad.append(f"temp files left in the checkpoint directory: {leftovers[:5]}")
    if bad:
        return _check(name, Status.FAIL, "; ".join(bad), fenced)
    return _check(name, Status.PASS, f"{len(fenced)} fenced unit(s), each releasing its "
                  "replica (confirmed stopped by its backend: a process confirmed dead, its "
                  "sockets closed by the kernel, or a Slurm step confirmed gone) and unit "
                  "resources; no temp file left in the checkpoint directory: "
                  + "; ".join(f"rank {e.payload.rank}: {e.payload.stopped or 'proof in released'}"
                              f" ({', '.join(e.payload.released)})" for e in fenced
                              if isinstance(e.payload, PoolUnit)), fenced)


def _uid(uids: Mapping[int, int], ranks: Mapping[tuple[int, int], set[int]],
         p: PoolUnit) -> int | None:
    """The uid the census saw for a binding: its pid's, else that of the rank's own process at
    that epoch (its step reports' pid). On Slurm the bound pid is the ``srun`` client on the
    head, which the census skips; the rank runs in the step, as the job's user."""
    if p.pid is not None and p.pid in uids:
        return uids[p.pid]
    seen = {uids[pid] for pid in ranks.get((p.rank or 0, p.epoch or 0), set()) if pid in uids}
    return seen.pop() if len(seen) == 1 else None


def binding_kept_quota_and_permissions(log: JobLog, artifacts: Artifacts | None) -> Check:
    name = "new_binding_kept_quota_and_permissions"
    found = _new_bindings(log)
    if isinstance(found, str):
        return _check(name, Status.UNEXPLAINED, found)
    bound, _ = found
    if not bound:
        return _check(name, Status.NOT_APPLICABLE, "no replica was bound after the fault")
    all_bound = log.unit_events(UnitState.BOUND)
    bad: list[str] = []
    cited: list[Event] = []
    uids = artifacts.uids if artifacts is not None else {}
    ranks = {k: {st.pid for st in v if st.pid is not None}
             for k, v in log.by_rank_epoch().items()}
    unknown_uid: list[int] = []
    for b in bound:
        p = b.payload
        assert isinstance(p, PoolUnit)
        prev = [e for e in all_bound if isinstance(e.payload, PoolUnit)
                and e.payload.rank == p.rank and (e.payload.epoch or 0) < (p.epoch or 0)]
        if not prev:
            continue
        old = max(prev, key=lambda e: e.event_time)
        op = old.payload
        assert isinstance(op, PoolUnit)
        cited += [old, b]
        ocpu, ncpu = op.resources.get("cpus"), p.resources.get("cpus")
        if not isinstance(ocpu, list) or not isinstance(ncpu, list):
            bad.append(f"rank {p.rank}: a binding without its cpus ({ocpu!r} -> {ncpu!r})")
        elif len(ocpu) != len(ncpu):
            bad.append(f"rank {p.rank}: {len(ocpu)} cpus on {op.unit} -> {len(ncpu)} on "
                       f"{p.unit}")
        for key in ("quota_pct", "cpu_quota_pct"):
            if op.resources.get(key) != p.resources.get(key):
                bad.append(f"rank {p.rank}: {key} {op.resources.get(key)} -> "
                           f"{p.resources.get(key)}")
        ou, nu = _uid(uids, ranks, op), _uid(uids, ranks, p)
        if ou is None or nu is None:
            unknown_uid.append(p.rank or 0)
        elif ou != nu:
            bad.append(f"rank {p.rank}: uid {ou} -> {nu}")
    if bad:
        return _check(name, Status.FAIL, "; ".join(bad), cited)
    if unknown_uid:
        return _check(name, Status.UNEXPLAINED, f"the uid of the old or new replica of ranks "
                      f"{sorted(set(unknown_uid))} was not observed", cited)
    return _check(name, Status.PASS, "each new binding has as many cpus as the one it "
                  "replaced, the same quota, and runs as the same uid (the rank's own process: "
                  "the bound pid's, or on Slurm the step's rank reporting at that epoch)", cited)
