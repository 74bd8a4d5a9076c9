"""Step alignment: gather one step's reports from the ranks of a group (a pipeline stage,
or the whole job) and close the step once some rank is ``close_lag`` steps ahead, or (after
the first step, closed that way, has made the ranks known) once every known rank reported it.
Closing happens in event-time order, so it is deterministic.

State is a ``StepGroup``; as JSON: ``{"ranks": {rank: its last step}, "pending": [[step, {rank:
[value, time]}], ...], "closed": step, "max": step}`` (string keys), and ``"skip"`` once a
restart set it.

A rank whose step goes back (a restarted job resumed from its checkpoint: the steps start again
at checkpoint + 1, whether or not the ``LOADED`` event was seen) restarts the count, as a resume
does; the other ranks going back after it find the count already restarted. The first step
closed after a restart is left out (``WARMUP_STEPS``): a restarted job's first step is slow
for reasons of its own (allocator, autotuning, data loader start) and is no slowdown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

T = TypeVar("T")


class Cell:
    """One rank's report of a step: its value (compute ms) and event time (JSON: ``[value,
    time]``). Plain classes, not NamedTuples, here and in ``Pending``: compiled (native.py),
    they are built without a Python call, three times per step report."""

    __slots__ = ("time", "value")

    def __init__(self, value: float, time: int) -> None:
        self.value = value
        self.time = time

    def doc(self) -> list[Any]:
        return [self.value, self.time]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cell) and (self.value, self.time) == (other.value, other.time)

    def __repr__(self) -> str:
        return f"Cell({self.value!r}, {self.time!r})"


class Pending:
    """A step not closed yet: the reports so far, by rank."""

    __slots__ = ("row", "step")

    def __init__(self, step: int, row: dict[str, Cell]) -> None:
        self.step = step
        self.row = row

    def doc(self) -> list[Any]:
        return [self.step, {r: c.doc() for r, c in self.row.items()}]

    @classmethod
    def of(cls, doc: list[Any]) -> Pending:
        step, row = doc
        return cls(int(step), {str(r): Cell(float(c[0]), int(c[1])) for r, c in row.items()})


class Flag(NamedTuple):
    """One window's verdict on a key (JSON: ``[over, time, step]``)."""

    over: bool  # the window stood over the threshold
    time: int  # the event time of the step that closed it
    step: int

    @classmethod
    def of(cls, doc: list[Any]) -> Flag:
        return cls(bool(doc[0]), int(doc[1]), int(doc[2]))


def flags_doc(flags: dict[str, list[Flag]]) -> dict[str, list[list[Any]]]:
    return {k: [list(f) for f in ring] for k, ring in flags.items()}


def flags_from_doc(doc: dict[str, Any]) -> dict[str, list[Flag]]:
    return {str(k): [Flag.of(f) for f in ring] for k, ring in doc.items()}


ClosedStep = tuple[int, dict[str, Cell]]  # step, rank -> its cell
WARMUP_STEPS = 1  # closed steps after a restart that are not judged


@dataclass(slots=True)
class StepGroup:
    """The step alignment of one group (JSON via ``doc``/``from_doc``, the layout in the
    module doc; ``skip`` is written only once a restart set it)."""

    ranks: dict[str, int] = field(default_factory=dict)  # rank -> last step (-1: none yet)
    pending: list[Pending] = field(default_factory=list)  # ascending by step
    closed: int = -1
    max: int = -1
    skip: int | None = None  # closed steps still left out after a restart

    def doc(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ranks": self.ranks,
            "pending": [p.doc() for p in self.pending],
            "closed": self.closed, "max": self.max}
        if self.skip is not None:
            out["skip"] = self.skip
        return out

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> StepGroup:
        skip = doc.get("skip")
        return cls(ranks={str(r): int(v) for r, v in doc["ranks"].items()},
                   pending=[Pending.of(p) for p in doc["pending"]],
                   closed=int(doc["closed"]), max=int(doc["max"]),
                   skip=None if skip is None else int(skip))


def new_group() -> StepGroup:
    return StepGroup()


def add(group: StepGroup, rank: str, step: int, value: float, time: int,
        close_lag: int) -> list[ClosedStep]:
    """Add one report; return the steps it closes (ascending). Reports for closed steps are
    dropped (a rank far behind its peers was already judged without them)."""
    ranks = group.ranks
    last = ranks.get(rank)
    if last is not None and 0 <= step <= last:
        reset(group)  # this rank went back: a restart from a checkpoint
    ranks[rank] = step
    if step <= group.closed:
        return []
    pending = group.pending
    cell = Cell(value, time)
    for i in range(len(pending) - 1, -1, -1):
        entry = pending[i]
        if entry.step == step:
            entry.row[rank] = cell
            break
        if entry.step < step:
            pending.insert(i + 1, Pending(step, {rank: cell}))
            break
    else:
        pending.insert(0, Pending(step, {rank: cell}))
    if step > group.max:
        group.max = step
    out: list[ClosedStep] = []
    while pending:
        head = pending[0]
        first, first_row = head.step, head.row
        # "every known rank reported" only once the first step was closed by lag: by then the
        # ranks present at the start are known
        if group.max - first >= close_lag or (
                group.closed >= 0 and len(first_row) >= len(ranks)):
            del pending[0]
            group.closed = first
            if group.skip:
                group.skip -= 1
                continue
            out.append((first, first_row))
        else:
            break
    return out


def reset(group: StepGroup) -> None:
    """A resume from a checkpoint restarts the step count: forget pending steps."""
    group.pending = []
    group.closed = -1
    group.max = -1
    group.skip = WARMUP_STEPS
    ranks = group.ranks
    for rank in ranks:
        ranks[rank] = -1


def _push(rings: dict[str, list[T]], key: str, item: T, size: int) -> list[T]:
    """Append ``item`` to ``key``'s ring (a JSON list kept in the state), at most ``size``."""
    ring = rings.setdefault(key, [])
    ring.append(item)
    if len(ring) > size:
        del ring[0]
    return ring


def push_window(hist: dict[str, list[float]], key: str, value: float, size: int) -> float | None:
    """Append to a rolling window; return its mean once it holds ``size`` values."""
    ring = _push(hist, key, value, size)
    return sum(ring) / size if len(ring) == size else None


def push_window_stats(hist: dict[str, list[float]], key: str, value: float,
                      size: int) -> tuple[float, float] | None:
    """Append to a rolling window; return its (median, mean) once it holds ``size`` values.
    One outlying step in an odd window does not move the median; the mean still shows a
    rank that is slow every other step."""
    ring = _push(hist, key, value, size)
    if len(ring) != size:
        return None
    ordered: list[float] = sorted(ring)
    mid = size // 2
    med = ordered[mid] if size % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return med, sum(ordered) / size


def push_flag(flags: dict[str, list[Flag]], key: str, flag: Flag, n: int) -> list[Flag]:
    """Keep the last ``n`` window flags of ``key``."""
    return _push(flags, key, flag, n)
