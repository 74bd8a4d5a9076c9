"""Slurm's own view of the cluster, parsed from its CLIs' machine-readable output: pure.

The Slurm backend reads Slurm only through its commands (never its state files): ``sinfo
--json`` for nodes, ``squeue --json`` for jobs, ``scontrol -o show step`` (one ``key=value`` line
per step: ``squeue``'s step listing has no state) for steps. These functions turn that text
into typed values, and ``pool`` joins them into what the actuator's pool needs: the job's
allocation and the spare nodes it may move a rank to. Tested on output captured from the real
``slurm-wlm`` 22.05 of the dev cluster (tests/fixtures/slurm).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from trainguard.compat import StrEnum
from trainguard.events.payloads import SchedulerEnd


class SlurmParseError(ValueError):
    """Slurm printed something this parser cannot read; the message names the command and why."""


class NodeHealth(StrEnum):
    """What a node's state means for placing ranks on it."""

    USABLE = "usable"        # idle, mixed or allocated, no drain/down flag
    DRAINING = "draining"    # drained or draining: no new work (ours or Slurm's decision)
    DOWN = "down"            # down, not responding, failed: lost


_DOWN = {"DOWN", "NOT_RESPONDING", "FAIL", "FAILING", "POWERED_DOWN", "POWER_DOWN"}
_DRAIN = {"DRAIN", "DRAINING", "DRAINED"}


@dataclass(frozen=True)
class SlurmNode:
    name: str
    address: str
    state: str                 # Slurm's base state, lower case: idle, mixed, allocated, down...
    flags: tuple[str, ...]     # DRAIN, NOT_RESPONDING, ...
    reason: str
    features: tuple[str, ...]

    @property
    def health(self) -> NodeHealth:
        words = {self.state.upper(), *self.flags}
        if words & _DOWN:
            return NodeHealth.DOWN
        if words & _DRAIN:
            return NodeHealth.DRAINING
        return NodeHealth.USABLE


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    state: str                 # RUNNING, PENDING, CANCELLED, ...
    nodes: tuple[str, ...]     # expanded


@dataclass(frozen=True)
class SlurmStep:
    step_id: str               # "<job>.<step>", e.g. "12.0" or "12.batch"
    name: str
    state: str
    nodes: tuple[str, ...]

    @property
    def job_id(self) -> int:
        return int(self.step_id.split(".", 1)[0])


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> tuple[str, ...]:
    """``tgn[1-3,10],login`` → ``(tgn1, tgn2, tgn3, tgn10, login)``, as ``scontrol show
    hostnames`` does (zero padding kept: ``n[01-02]`` → ``n01, n02``)."""
    out: list[str] = []
    for item in _split_top(text.strip()):
        if not item:
            continue
        m = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", item)
        if m is None:
            if "[" in item or "]" in item:
                raise SlurmParseError(f"hostlist: cannot read {item!r}")
            out.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            r = _RANGE.match(part)
            if r is None:
                raise SlurmParseError(f"hostlist: bad range {part!r} in {item!r}")
            lo, hi = r.group(1), r.group(2) or r.group(1)
            width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
            if int(hi) < int(lo) or int(hi) - int(lo) > 100_000:
                raise SlurmParseError(f"hostlist: bad range {part!r} in {item!r}")
            out.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(int(lo), int(hi) + 1))
    return tuple(out)


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _load(text: str, what: str, key: str) -> list[dict[str, object]]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SlurmParseError(f"{what}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get(key), list):
        raise SlurmParseError(f"{what}: no '{key}' list")
    errors = doc.get("errors") or []
    if errors:
        raise SlurmParseError(f"{what}: Slurm reported errors: {errors}")
    items = doc[key]
    assert isinstance(items, list)
    if not all(isinstance(i, dict) for i in items):
        raise SlurmParseError(f"{what}: '{key}' holds a non-object")
    return items


def _str(item: dict[str, object], key: str, what: str) -> str:
    value = item.get(key, "")
    if not isinstance(value, str):
        raise SlurmParseError(f"{what}: field {key} is {value!r}, not text")
    return value


def _strs(item: dict[str, object], key: str) -> tuple[str, ...]:
    value = item.get(key) or []
    if isinstance(value, str):  # features: "a,b" in 22.05
        return tuple(v for v in value.split(",") if v)
    if isinstance(value, list):
        return tuple(str(v) for v in value)
    return ()


def parse_sinfo_json(text: str) -> list[SlurmNode]:
    """``sinfo --json`` → nodes (22.05's openapi v0.0.38 layout)."""
    out = []
    for item in _load(text, "sinfo --json", "nodes"):
        out.append(SlurmNode(name=_str(item, "name", "sinfo --json"),
                             address=_str(item, "address", "sinfo --json"),
                             state=_str(item, "state", "sinfo --json").lower(),
                             flags=tuple(f.upper() for f in _strs(item, "state_flags")),
                             reason=_str(item, "reason", "sinfo --json"),
                             features=_strs(item, "features")))
    return out


def parse_squeue_json(text: str) -> list[SlurmJob]:
    """``squeue --json`` → jobs, node lists expanded."""
    out = []
    for item in _load(text, "squeue --json", "jobs"):
        job_id = item.get("job_id")
        if not isinstance(job_id, int) or isinstance(job_id, bool):
            raise SlurmParseError(f"squeue --json: job_id is {job_id!r}")
        out.append(SlurmJob(job_id=job_id, name=_str(item, "name", "squeue --json"),
                            state=_str(item, "job_state", "squeue --json").upper(),
                            nodes=expand_hostlist(_str(item, "nodes", "squeue --json"))))
    return out


JOB_STATE_FORMAT = "%i|%T|%r"  # squeue --format: job id, state (long name), reason


def parse_job_state(text: str, job_id: int) -> tuple[str, str] | None:
    """``squeue --noheader --states=all --jobs=<id> --format=%i|%T|%r`` → the job's state and
    reason ("" for Slurm's "None"); None when the job is not listed."""
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split("|", 2)
        if len(parts) != 3 or not (parts[0].isascii() and parts[0].isdigit()) or not parts[1]:
            raise SlurmParseError(f"squeue job state: {line[:80]!r} is not id|STATE|reason")
        if int(parts[0]) == job_id:
            return parts[1].upper(), "" if parts[2] == "None" else parts[2]
    return None


# Slurm's final job states, as ``squeue``/``scontrol`` name them, and what each means here
_FINAL = {"COMPLETED": SchedulerEnd.COMPLETED, "CANCELLED": SchedulerEnd.CANCELLED,
          "TIMEOUT": SchedulerEnd.TIMEOUT, "PREEMPTED": SchedulerEnd.PREEMPTED,
          "DEADLINE": SchedulerEnd.DEADLINE, "NODE_FAIL": SchedulerEnd.NODE_FAIL,
          "FAILED": SchedulerEnd.FAILED, "OUT_OF_MEMORY": SchedulerEnd.OUT_OF_MEMORY,
          "BOOT_FAIL": SchedulerEnd.BOOT_FAIL}


def scheduler_end(state: str | None) -> SchedulerEnd | None:
    """How Slurm ended the allocation, from its job state: the final state; ``gone`` when Slurm
    no longer lists the job (None: its record aged out, ``MinJobAge``); None while it lives
    (pending, running, suspended, completing, requeued: any state that is not final)."""
    if state is None:
        return SchedulerEnd.GONE
    return _FINAL.get(state)


_KV = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z/:_]*)=")


def parse_keyvalues(line: str) -> dict[str, str]:
    """One ``scontrol -o`` line → its fields (values may hold spaces: a key starts a field
    only where ``Word=`` follows a space)."""
    marks = list(_KV.finditer(line))
    fields: dict[str, str] = {}
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(line)
        fields[m.group(1)] = line[m.end():end].strip()
    return fields


def parse_scontrol_steps(text: str) -> list[SlurmStep]:
    """``scontrol -o show step`` → steps ("No job steps in the system" → none)."""
    out = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("No job steps"):
            continue
        f = parse_keyvalues(line)
        if "StepId" not in f or "State" not in f:
            raise SlurmParseError(f"scontrol show step: no StepId/State in {line[:80]!r}")
        nodes = f.get("NodeList", "")
        out.append(SlurmStep(step_id=f["StepId"], name=f.get("Name", ""), state=f["State"],
                             nodes=expand_hostlist(nodes) if nodes not in ("", "(null)")
                             else ()))
    return out


@dataclass(frozen=True)
class SlurmPool:
    """The job's allocation as Slurm sees it, and the spares a rank may move to."""

    allocation: tuple[SlurmNode, ...]   # the job's nodes, in the order Slurm lists them
    spares: tuple[SlurmNode, ...]       # usable nodes with the spare feature, not in the job
    lost: tuple[str, ...]               # allocation nodes that are down or draining


def pool(nodes: Sequence[SlurmNode], job: SlurmJob, spare_feature: str = "spare") -> SlurmPool:
    by_name = {n.name: n for n in nodes}
    allocation = tuple(by_name[n] for n in job.nodes if n in by_name)
    spares = tuple(n for n in nodes if spare_feature in n.features and n.name not in job.nodes
                   and n.health is NodeHealth.USABLE)
    lost = tuple(n.name for n in allocation if n.health is not NodeHealth.USABLE)
    return SlurmPool(allocation=allocation, spares=spares, lost=lost)


def steps_on(steps: Iterable[SlurmStep], job_id: int) -> list[SlurmStep]:
    return [s for s in steps if s.job_id == job_id]
