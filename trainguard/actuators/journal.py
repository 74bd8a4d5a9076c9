"""The actuator's local durable journal: append-only, one checksummed record per line.

Two journals use this framing, each its own file:
- the **replica journal** (``local.py``, and ``zygote.py`` for the ranks it forks): every
  replica the actuator starts, written *before the replica may run* (it waits at a gate until
  its record is on disk): pid, process start time (``/proc/<pid>/stat`` field 22, clock ticks
  since boot), boot id, job, rank, epoch, unit, command id. Before any signal a pid is
  re-proven against its record (``fencing.open_proven``); a pid without a record is never
  signalled, whatever the event log says.
- the **command journal** (``executor.py``): write-ahead per command, ``intent`` (the plan:
  placement, quarantined units, the command itself) -> ``fenced`` -> ``launched`` -> ``done``.
  A restarted actuator finishes the command that has no ``done`` (``Executor.recover``).

Framing: ``<crc32 of body, 8 hex digits> <body>\\n`` where body is one JSON object in ASCII
(``json.dumps`` escapes every newline and non-ASCII character, so a record is one line). A
line whose checksum, JSON or fields do not check out (a torn last write, a flipped bit) is
skipped and counted (``Journal.skipped``), never a crash. Each append is one ``write`` on an
``O_APPEND`` descriptor (atomic between the actuator and the zygote appending to one file),
followed by ``fsync`` when ``sync`` (the write-ahead points).
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

Phase = Literal["intent", "fenced", "launched", "done"]
PHASES: tuple[Phase, ...] = ("intent", "fenced", "launched", "done")
Record = dict[str, object]
MAX_LINE = 1 << 20


def frame(record: Mapping[str, object]) -> bytes:
    body = json.dumps(record, separators=(",", ":"), sort_keys=True,
                      ensure_ascii=True).encode("ascii")
    return b"%08x %s\n" % (zlib.crc32(body), body)


def parse(data: bytes) -> tuple[list[Record], int]:
    """Every intact record of ``data``, and how many lines were skipped as corrupt (empty lines
    are neither)."""
    out: list[Record] = []
    skipped = 0
    for line in data.split(b"\n"):
        if not line:
            continue
        record = _parse_line(line)
        if record is None:
            skipped += 1
        else:
            out.append(record)
    return out, skipped


def _parse_line(line: bytes) -> Record | None:
    if len(line) < 10 or len(line) > MAX_LINE or line[8:9] != b" ":
        return None
    head, body = line[:8], line[9:]
    try:
        crc = int(head.decode("ascii"), 16)
    except (UnicodeDecodeError, ValueError):
        return None
    if crc != zlib.crc32(body):
        return None
    try:
        value = json.loads(body.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class Journal:
    """One journal file (``path`` None: in memory, for tests that need no durability)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._memory: list[Record] = []
        self._cache: tuple[int, list[Record], int] | None = None  # (size, records, skipped)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: Mapping[str, object], *, sync: bool = True) -> None:
        if self.path is None:
            self._memory.append(json.loads(json.dumps(record)))
            return
        data = frame(record)
        created = not self.path.exists()
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            if created and sync:  # the new file's name is durable too
                _fsync_dir(self.path.parent)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data  # after a torn last record: start a fresh line
            os.write(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> list[Record]:
        """Every intact record, oldest first (re-read only when the file has grown)."""
        if self.path is None:
            return list(self._memory)
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if self._cache is None or self._cache[0] != size:
            records, skipped = parse(self.path.read_bytes())
            self._cache = (size, records, skipped)
        return list(self._cache[1])

    @property
    def skipped(self) -> int:
        self.read()
        return self._cache[2] if self._cache is not None else 0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- the replica journal ---------------------------------------------------------------------


@dataclass(frozen=True)
class ReplicaRecord:
    """One replica this actuator (or its warm launcher) started."""

    job: str
    rank: int
    epoch: int
    unit: str
    pid: int
    start_ticks: int  # /proc/<pid>/stat field 22
    boot_id: str
    command_id: str | None = None
    kind: Literal["replica"] = "replica"

    def to_record(self) -> Record:
        return asdict(self)


def replica_of(record: Mapping[str, object]) -> ReplicaRecord | None:
    """The replica a record describes, or None (another kind, or fields of the wrong type)."""
    if record.get("kind") != "replica":
        return None
    ints = [record.get(k) for k in ("rank", "epoch", "pid", "start_ticks")]
    strs = [record.get(k) for k in ("job", "unit", "boot_id")]
    cid = record.get("command_id")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in ints) \
            or not all(isinstance(v, str) and v for v in strs) \
            or not (cid is None or isinstance(cid, str)):
        return None
    rank, epoch, pid, ticks = (int(str(v)) for v in ints)
    job, unit, boot = (str(v) for v in strs)
    return ReplicaRecord(job, rank, epoch, unit, pid, ticks, boot,
                         cid if isinstance(cid, str) else None)


def replicas(journal: Journal, job: str) -> list[ReplicaRecord]:
    """The job's replicas, in the order they were started."""
    out = []
    for rec in journal.read():
        rep = replica_of(rec)
        if rep is not None and rep.job == job:
            out.append(rep)
    return out


# --- the command journal ---------------------------------------------------------------------


@dataclass(frozen=True)
class Intent:
    """What a command is to do, written before it fences anything."""

    cid: str  # the command id (or a journal-made id for the initial launch)
    action: str
    placement: Mapping[int, str]  # rank -> unit once done
    quarantine: tuple[str, ...] = ()
    reason: str = ""
    command: Mapping[str, object] | None = None  # the command as received (JSON)
    from_epoch: int = 0  # the job's epoch when it was written: a finished one is higher
    phases: tuple[Phase, ...] = field(default=("intent",))
    status: str | None = None  # of ``done``

    def to_record(self) -> Record:
        return {"kind": "command", "phase": "intent", "cid": self.cid, "action": self.action,
                "placement": {str(r): u for r, u in self.placement.items()},
                "quarantine": list(self.quarantine), "reason": self.reason,
                "command": dict(self.command) if self.command is not None else None,
                "from_epoch": self.from_epoch}

    @property
    def phase(self) -> Phase:
        return self.phases[-1]


def phase_record(cid: str, phase: Phase, status: str | None = None) -> Record:
    return {"kind": "command", "phase": phase, "cid": cid, "status": status}


def commands(journal: Journal) -> list[Intent]:
    """Every command intent with the phases it reached, in the order they were written."""
    out: dict[str, Intent] = {}
    for rec in journal.read():
        if rec.get("kind") != "command":
            continue
        cid, named = rec.get("cid"), rec.get("phase")
        phase = next((p for p in PHASES if p == named), None)
        if not isinstance(cid, str) or phase is None:
            continue
        if phase == "intent":
            intent = _intent(rec, cid)
            if intent is not None:
                out.pop(cid, None)
                out[cid] = intent
            continue
        old = out.get(cid)
        if old is not None and phase not in old.phases:
            status = rec.get("status")
            out[cid] = replace(old, phases=(*old.phases, phase),
                               status=status if isinstance(status, str) else old.status)
    return list(out.values())


def in_flight(journal: Journal) -> Intent | None:
    """The last command written, unless it is ``done`` (commands run one at a time: an older
    one without ``done``, its record lost, was superseded and is never run again)."""
    every = commands(journal)
    return every[-1] if every and "done" not in every[-1].phases else None


def _intent(rec: Mapping[str, object], cid: str) -> Intent | None:
    action, placement = rec.get("action"), rec.get("placement")
    quarantine, reason, command = rec.get("quarantine"), rec.get("reason", ""), rec.get("command")
    since = rec.get("from_epoch", 0)
    if not isinstance(since, int) or isinstance(since, bool):
        return None
    if not isinstance(action, str) or not isinstance(placement, dict) \
            or not isinstance(quarantine, list) or not isinstance(reason, str) \
            or not (command is None or isinstance(command, dict)):
        return None
    ranks: dict[int, str] = {}
    for k, v in placement.items():
        if not (isinstance(k, str) and k.isdigit() and isinstance(v, str)):
            return None
        ranks[int(k)] = v
    if not all(isinstance(u, str) for u in quarantine):
        return None
    return Intent(cid, action, ranks, tuple(str(u) for u in quarantine), reason, command, since)
