"""What a drill observes outside the log: a process-table census of the job's rank processes
(found by the ``TRAINGUARD_JOB_ID`` the local backend puts in their environment), and the
checkpoint directory on disk after the drill (every checkpoint verified, temp files)."""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard_sdk.checkpoint.store import QUARANTINE, STEP_DIR_RE, CheckpointStore, Valid

from trainguard.drills.evidence.model import Artifacts, CheckpointFile

_TMP_RE = re.compile(r"^\..*\.tmp-")
# Launcher clients that carry a rank's environment but are not the rank: Slurm's ``srun`` on
# the head forwards a step's I/O, the replica itself runs on the node.
CLIENTS = frozenset({"srun"})


@dataclass
class Seen:
    pid: int
    rank: int
    epoch: int
    uid: int
    ppid: int
    first: float
    last: float


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k.startswith(b"TRAINGUARD_"):
            out[k.decode()] = v.decode(errors="replace")
    return out


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _status(pid: int) -> tuple[str, int, int] | None:
    """(state letter, uid, ppid) from /proc/<pid>/status."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    state = uid = ppid = None
    for line in status.splitlines():
        if line.startswith("State:"):
            state = line.split()[1]
        elif line.startswith("Uid:"):
            uid = int(line.split()[1])
        elif line.startswith("PPid:"):
            ppid = int(line.split()[1])
    if state is None or uid is None or ppid is None:
        return None
    return state, uid, ppid


class Census(threading.Thread):
    """Every ``interval_s``: which replicas of ``job_id`` are alive (not zombies), per rank.

    A replica is a process with the job's id in its environment whose parent has not: the
    helpers a rank forks (torch compile workers) inherit the environment and are not counted."""

    def __init__(self, job_id: str, interval_s: float = 0.1) -> None:
        super().__init__(daemon=True, name=f"census-{job_id}")
        self.job_id, self.interval_s = job_id, interval_s
        self.seen: dict[int, Seen] = {}
        self.max_live: dict[int, int] = {}
        self.live: dict[int, list[int]] = {}
        self._skip: dict[int, float] = {}  # pid -> until when it is not looked at again
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval_s)

    def sample(self) -> None:
        now = time.time()
        live: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            pid = int(name)
            if self._skip.get(pid, 0.0) > now:
                continue
            known = self.seen.get(pid)
            if known is None:
                env = _environ(pid)
                if env.get("TRAINGUARD_JOB_ID") != self.job_id:
                    # not (yet: a forked child shows its parent's environment until exec)
                    self._skip[pid] = now + 0.5
                    continue
                if _comm(pid) in CLIENTS:
                    self._skip[pid] = float("inf")
                    continue
                st = _status(pid)
                if st is None:
                    continue
                known = Seen(pid, int(env.get("TRAINGUARD_RANK", "-1")),
                             int(env.get("TRAINGUARD_BINDING_EPOCH", "0")), st[1], st[2],
                             now, now)
                with self._lock:
                    self.seen[pid] = known
            st = _status(pid)
            if st is None or st[0] in ("Z", "X"):
                continue
            known.last = now
            live.setdefault(known.rank, []).append(pid)
        with self._lock:
            live = {r: [p for p in ps if self.seen[p].ppid not in self.seen]
                    for r, ps in live.items()}
            self.live = live
            for rank, pids in live.items():
                self.max_live[rank] = max(self.max_live.get(rank, 0), len(pids))

    def pids(self, ranks: set[int] | None = None) -> list[int]:
        with self._lock:
            return sorted(p for r, ps in self.live.items() if ranks is None or r in ranks
                          for p in ps)

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=5)

    def uids(self) -> dict[int, int]:
        with self._lock:
            return {s.pid: s.uid for s in self.seen.values()}


def inspect_checkpoints(root: Path) -> tuple[tuple[CheckpointFile, ...], tuple[str, ...]]:
    """Every checkpoint directory under ``root`` (and its quarantine), verified; temp files."""
    store = CheckpointStore(root)
    out: list[CheckpointFile] = []
    for step, path in store.steps():
        v = store.verify(path, step)
        if not path.exists():
            continue  # pruned (keep K) while it was being verified
        out.append(CheckpointFile(step, isinstance(v, Valid),
                                  "" if isinstance(v, Valid) else v.reason,
                                  committed=True if isinstance(v, Valid) else v.committed))
    qdir = root / QUARANTINE
    if qdir.is_dir():
        for path in sorted(qdir.iterdir()):
            m = STEP_DIR_RE.match(path.name.rsplit("-", 1)[0])
            if m:
                v = store.verify(path, int(m.group(1)))
                out.append(CheckpointFile(int(m.group(1)), isinstance(v, Valid),
                                          "" if isinstance(v, Valid) else v.reason,
                                          quarantined=True))
    temps: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        for dirpath, _dirs, files in os.walk(root):
            temps += [os.path.relpath(os.path.join(dirpath, f), root) for f in files
                      if _TMP_RE.match(f)]
    return tuple(out), tuple(sorted(temps))


def collect_settled(root: Path, census: Census | None, settle_s: float = 2.0) -> Artifacts:
    """The checkpoint directory while the job may still be running: a temp file counts as
    left behind only if it is still there ``settle_s`` later (a save in progress renames its
    temp files within that time); the checkpoints are those of the second look."""
    _, first = inspect_checkpoints(root)
    time.sleep(settle_s)
    art = collect(root, census)
    return Artifacts(checkpoints=art.checkpoints,
                     temp_files=tuple(t for t in art.temp_files if t in first),
                     max_live_replicas=art.max_live_replicas, uids=art.uids)


def collect(root: Path, census: Census | None) -> Artifacts:
    ckpts, temps = inspect_checkpoints(root)
    return Artifacts(checkpoints=ckpts, temp_files=temps,
                     max_live_replicas=dict(census.max_live) if census else None,
                     uids=census.uids() if census else {})
