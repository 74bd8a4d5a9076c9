"""Files a user already has -> valid events, for ``trainguard replay --log`` (pure but for
reading the text the caller hands in).

- ``kmsg_events``: a kernel log (``/dev/kmsg`` records, any ``dmesg`` or ``journalctl -k``
  format, one per line) through the same parsers and follower as the agent.
- ``fault_events``: a cluster's fault log (CSV or JSON lines, ``health_import``).
- ``step_events``: a step trace (CSV or JSON lines) with a column mapping
  (``rank=col,step=col,compute_ms=col,time=col,...``).

Event ids are derived from the input (kind, node/job, line), so importing a file twice gives
the same events (a replay folds them once). Bad input raises ``BadInput`` naming the file,
the line, the field and the value; nothing is half-written by the caller.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import tzinfo
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainguard.collectors.base import Discrete, Reading
from trainguard.collectors.health_import import import_fault_log_text, parse_time_us
from trainguard.collectors.kernel_log import KernelLogFollower, ListSource, Origin, TimeContext
from trainguard.compat import UTC
from trainguard.configfile import show
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.errors import ContractError
from trainguard.events.ids import derived_id
from trainguard.events.payloads import StepReport

SOURCE = "trainguard.import"


class BadInput(ValueError):
    """Bad input, as one line: ``file:line: field 'f': reason (got value)``."""


@dataclass
class Imported:
    events: list[Event] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # kind -> lines not read
    first_skipped: str | None = None  # "file:line: kind" of the first one


def _event(d: Discrete, ns: str, *parts: object) -> Event:
    return make_event(d.payload, event_id=derived_id(ns, *parts), job_id=d.job_id,
                      event_time=d.event_time, source=SOURCE, subject=d.subject)


# --- kernel log -------------------------------------------------------------------------


def _looks_kmsg(lines: Sequence[str]) -> bool:
    for ln in lines:
        if ln.strip() and not ln.startswith(" "):
            head = ln.split(";", 1)[0].split(",")
            return len(head) >= 3 and all(h.isdigit() for h in head[:3])
    return False


def kmsg_events(text: str, *, name: str, node: str, job_id: str | None = None,
                boot_time_us: int = 0, tz: tzinfo = UTC, year: int | None = None) -> Imported:
    """A kernel log file -> ``node.health`` events. Lines that look like a signal but cannot
    be read are counted in ``skipped`` (a real log has them), never fatal."""
    lines = text.splitlines()
    origin: Origin = "kmsg" if _looks_kmsg(lines) else "dmesg"
    ctx = TimeContext(boot_time_us=boot_time_us, tz=tz, year=year)
    follower = KernelLogFollower(ListSource(origin), node=node, job_id=job_id,
                                 time_context=ctx)
    out = Imported()
    for n, line in enumerate(lines, 1):
        if origin == "kmsg" and line.startswith(" "):
            continue  # a record's KEY=VALUE continuation
        reading = Reading()
        follower.feed(line, boot_time_us, reading)
        for kind, count in reading.malformed.items():
            out.skipped[kind] = out.skipped.get(kind, 0) + count
            if out.first_skipped is None:
                out.first_skipped = f"{name}:{n}: {kind}: {line[:120]!r}"
        for i, d in enumerate(reading.discrete):
            out.events.append(_event(d, "import.kmsg", follower.job_id, node, n, i))
    return out


# --- fault logs -------------------------------------------------------------------------


def fault_events(text: str, *, name: str, fmt: str, job_id: str | None = None,
                 default_tz: tzinfo = UTC) -> Imported:
    """A fault log (``fmt`` csv or jsonl) -> EXTERNAL_FAULT_START / _END events; the first bad
    row raises ``BadInput``."""
    result = import_fault_log_text(text, fmt, job_id=job_id, default_tz=default_tz)
    if result.errors:
        err = result.errors[0]
        more = f" ({len(result.errors) - 1} more bad rows)" if len(result.errors) > 1 else ""
        where = f"line {err.row}" if err.row >= 0 else "CSV"
        raise BadInput(f"{name}: {where}: {str(err).split(': ', 1)[-1]}{more}")
    out = Imported()
    for i, d in enumerate(result.discrete):
        h = d.payload
        out.events.append(_event(d, "import.fault", d.job_id, d.subject.node,
                                 getattr(h, "kind", ""), d.event_time, i))
    return out


# --- step traces ------------------------------------------------------------------------

STEP_FIELDS = frozenset(StepReport.model_fields)
MAPPABLE = STEP_FIELDS | {"time", "node", "job"}
REQUIRED_MAP = ("rank", "step", "compute_ms")
DEFAULT_START_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z: the axis of an untimed trace


def parse_mapping(text: str) -> dict[str, str]:
    """``rank=col,step=col,...`` -> field -> column; ``BadInput`` for a bad one."""
    mapping: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, col = part.partition("=")
        key, col = key.strip(), col.strip()
        if not sep or not key or not col:
            raise BadInput(f"--map: {part.strip()!r} is not field=column")
        if key not in MAPPABLE:
            raise BadInput(f"--map: unknown field {key!r} (one of "
                           f"{', '.join(sorted(MAPPABLE))})")
        mapping[key] = col
    missing = [k for k in REQUIRED_MAP if k not in mapping]
    if missing:
        raise BadInput(f"--map: no column for {', '.join(missing)} "
                       f"(needs {', '.join(REQUIRED_MAP)})")
    return mapping


def _rows(text: str, fmt: str, name: str) -> Iterable[tuple[int, Mapping[str, Any]]]:
    if fmt == "csv":
        reader = csv.DictReader(io.StringIO(text))
        try:
            for row in reader:
                if any(v not in (None, "") for v in row.values()):
                    yield reader.line_num, row
        except csv.Error as exc:
            raise BadInput(f"{name}: line {reader.line_num}: CSV error: {exc}") from None
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise BadInput(f"{name}: line {n}: not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise BadInput(f"{name}: line {n}: expected a JSON object, got "
                           f"{type(obj).__name__}")
        yield n, obj


def _number(value: Any, name: str, n: int, fld: str, col: str) -> Any:
    if isinstance(value, str):
        v = value.strip()
        try:
            return int(v)
        except ValueError:
            try:
                return float(v)
            except ValueError:
                raise BadInput(f"{name}: line {n}: field {fld!r} (column {col!r}): "
                               f"not a number (got {show(value)})") from None
    return value


def step_events(text: str, *, name: str, fmt: str, mapping: Mapping[str, str],
                job_id: str | None = None, node: str | None = None,
                world_size: int | None = None, default_tz: tzinfo = UTC,
                start_us: int = DEFAULT_START_US, step_interval_ms: float = 1000.0,
                ) -> Imported:
    """A step trace -> ``step.report`` events; the first bad row raises ``BadInput``.
    ``world_size``: the column's, else this, else (largest rank + 1) over the file. A trace
    without a time column is put on an axis: step N at ``start_us + N x step_interval_ms``."""
    rows: list[tuple[int, dict[str, Any], int, str | None, str]] = []
    for n, row in _rows(text, fmt, name):
        doc: dict[str, Any] = {}
        for fld, col in mapping.items():
            if col not in row:
                raise BadInput(f"{name}: line {n}: no column {col!r} (mapped to {fld!r})")
            value = row[col]
            if value is None or value == "":
                continue
            doc[fld] = value
        for fld in REQUIRED_MAP:
            if fld not in doc:
                raise BadInput(f"{name}: line {n}: field {fld!r} (column {mapping[fld]!r}): "
                               "missing")
        if "time" in mapping:
            if "time" not in doc:
                raise BadInput(f"{name}: line {n}: field 'time' (column {mapping['time']!r}): "
                               "missing")
            try:
                raw = doc.pop("time")
                t = parse_time_us(raw if _is_iso(raw) else
                                  _number(raw, name, n, "time", mapping["time"]), default_tz)
            except ValueError as exc:
                raise BadInput(f"{name}: line {n}: field 'time' (column {mapping['time']!r}): "
                               f"{exc}") from None
        else:
            step = _number(doc["step"], name, n, "step", mapping["step"])
            if not isinstance(step, int) or step < 0:
                raise BadInput(f"{name}: line {n}: field 'step' (column {mapping['step']!r}): "
                               f"not a step number (got {show(doc['step'])})")
            t = start_us + round(step * step_interval_ms * 1000)
            if t >= 2**53:
                raise BadInput(f"{name}: line {n}: field 'step' (column {mapping['step']!r}): "
                               f"step {step} x {step_interval_ms:g} ms is past any time")
        row_node = doc.pop("node", None)
        row_node = str(row_node) if row_node is not None else node
        row_job = doc.pop("job", None)
        jid = str(row_job) if row_job is not None else (job_id or "imported")
        for fld in list(doc):
            if fld != "loss" or isinstance(doc[fld], str):
                doc[fld] = _number(doc[fld], name, n, fld, mapping[fld])
        rows.append((n, doc, t, row_node, jid))
    if world_size is None:
        ranks = [d.get("rank") for _, d, _, _, _ in rows]
        world_size = max((r for r in ranks if isinstance(r, int)), default=0) + 1
    out = Imported()
    for n, doc, t, row_node, jid in rows:
        doc.setdefault("world_size", world_size)
        doc.setdefault("samples_consumed", 0)
        try:
            payload = StepReport(**doc)
            subject = Subject(rank=payload.rank, node=row_node)
            out.events.append(make_event(payload, event_id=derived_id("import.step", jid, n),
                                         job_id=jid, event_time=t, source=SOURCE,
                                         subject=subject))
        except ValidationError as exc:
            err = exc.errors()[0]
            fld = ".".join(str(p) for p in err["loc"])
            col = mapping.get(fld, fld)
            raise BadInput(f"{name}: line {n}: field {fld!r} (column {col!r}): "
                           f"{err['msg']} (got {show(err.get('input'))})") from None
        except ContractError as exc:
            raise BadInput(f"{name}: line {n}: {exc}") from None
    return out


def _is_iso(value: Any) -> bool:
    return isinstance(value, str) and ("T" in value or "-" in value.strip()[1:])


def trace_format(path: Path) -> str:
    return "csv" if path.suffix.lower() in (".csv", ".tsv") else "jsonl"
