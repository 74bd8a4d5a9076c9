"""Node faults recorded elsewhere -> ``NodeHealth`` events.

Two sources:

- a **fault log** kept by the cluster (JSON lines or CSV), one row per fault: node, start
  time, end time (empty while the fault lasts), fault class, and optionally a message and a
  code. Each row gives ``EXTERNAL_FAULT_START`` at its start and, once it has an end,
  ``EXTERNAL_FAULT_END`` at its end. Column names are matched case-insensitively against
  ``FIELD_ALIASES`` (``node``/``hostname``, ``start``/``start_time``, ...). Times are ISO-8601
  (``Z`` or an offset; none means ``default_tz``) or epoch numbers in s, ms, µs or ns
  (told apart by magnitude).
- **Kubernetes node conditions**: the JSON of ``kubectl get node NAME -o json`` (or of
  ``kubectl get nodes -o json``). Each unhealthy condition gives ``NODE_CONDITION`` with
  ``fault_class`` = the condition type, timed at its ``lastTransitionTime``: ``Ready`` when
  not ``True``; every other type (``MemoryPressure``, ``DiskPressure``, ``PIDPressure``,
  ``NetworkUnavailable``, node-problem-detector's ``KernelDeadlock``, ``ReadonlyFilesystem``,
  GPU conditions...) when ``True``. Types listed in ``positive_conditions`` are healthy when
  ``True`` instead.

The parsers are pure. A bad row never stops an import: it becomes a ``RowError`` naming the row
and the field, is counted, and the good rows around it are imported. ``FaultLogFollower`` and
``NodeConditionCollector`` wrap them as ``Collector``s that report each event once.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from trainguard.collectors.base import Discrete, Reading
from trainguard.compat import UTC, fromisoformat
from trainguard.events.envelope import Subject
from trainguard.events.payloads import NodeHealth, NodeHealthKind

log = logging.getLogger(__name__)

MAX_TIME_US = 2**53
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")

FIELD_ALIASES: Mapping[str, tuple[str, ...]] = {
    "node": ("node", "node_name", "nodename", "hostname", "host", "machine"),
    "start": ("start", "start_time", "started_at", "fault_start", "begin", "begin_time"),
    "end": ("end", "end_time", "ended_at", "fault_end", "resolved_at", "finish_time"),
    "fault_class": ("fault_class", "class", "fault_type", "category", "failure_class"),
    "message": ("message", "description", "detail", "details", "reason", "comment"),
    "code": ("code", "error_code", "xid"),
}
REQUIRED = ("node", "start", "fault_class")
DEFAULT_POSITIVE_CONDITIONS = frozenset({"Ready"})


@dataclass(frozen=True)
class RowError:
    """One refused row: ``row`` counts data rows from 1 (CSV: the file line number);
    ``where`` says which row in a structured source (e.g. a node's condition)."""

    row: int
    field: str | None
    reason: str
    where: str = ""

    def __str__(self) -> str:
        place = self.where or f"row {self.row}"
        if self.field is None:
            return f"{place}: {self.reason}"
        return f"{place}: field {self.field!r}: {self.reason}"


@dataclass
class ImportResult:
    discrete: list[Discrete] = field(default_factory=list)
    errors: list[RowError] = field(default_factory=list)
    error_kind: str = "fault_log_row"

    def to_reading(self) -> Reading:
        reading = Reading(discrete=list(self.discrete))
        if self.errors:
            reading.malformed[self.error_kind] = len(self.errors)
        return reading


@dataclass(frozen=True)
class Malformed:
    """A row that could not even be read as a record (bad JSON, wrong CSV shape)."""

    reason: str


class _RowFault(ValueError):
    def __init__(self, field_name: str | None, reason: str) -> None:
        super().__init__(reason)
        self.field_name = field_name
        self.reason = reason


# --- times ------------------------------------------------------------------------------


def parse_time_us(value: object, default_tz: tzinfo = UTC) -> int:
    """An ISO-8601 string or an epoch number (s / ms / µs / ns by magnitude) -> epoch µs."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"expected a time, got {value!r}")
    if isinstance(value, int | float):
        return _epoch_number_us(float(value) if isinstance(value, float) else value)
    if not isinstance(value, str):
        raise ValueError(f"expected a time, got {type(value).__name__}")
    text = value.strip()
    if not text:
        raise ValueError("empty time")
    if re.fullmatch(r"[0-9]{1,20}", text):
        return _epoch_number_us(int(text))
    if re.fullmatch(r"[0-9]{1,20}\.[0-9]{1,9}", text):
        return _epoch_number_us(float(text))
    try:
        dt = fromisoformat(text.replace(" UTC", "+00:00"))
    except ValueError:
        raise ValueError(f"{text[:60]!r} is neither ISO-8601 nor an epoch number") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=default_tz)
    us = _dt_us(dt)
    _check_range(us)
    return us


def _dt_us(dt: datetime) -> int:
    delta = dt - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _epoch_number_us(n: int | float) -> int:
    if n != n or n in (float("inf"), float("-inf")):
        raise ValueError(f"{n!r} is not a time")
    a = abs(n)
    if a >= 10**20:
        raise ValueError(f"{n!r} is too large for a time")
    if a < 1e11:
        us = round(n * 1_000_000)
    elif a < 1e14:
        us = round(n * 1_000)
    elif a < 1e17:
        us = round(n)
    else:
        us = round(n / 1_000)
    _check_range(us)
    return us


def _check_range(us: int) -> None:
    if not 0 <= us < MAX_TIME_US:
        raise ValueError(f"time {us} µs is out of range")


# --- fault logs ---------------------------------------------------------------------------


def _normalise_keys(row: Mapping[str, Any]) -> dict[str, Any]:
    lowered = {str(k).strip().lower(): v for k, v in row.items() if k is not None}
    out: dict[str, Any] = {}
    for name, aliases in FIELD_ALIASES.items():
        for alias in aliases:
            if alias in lowered:
                out[name] = lowered[alias]
                break
    return out


def _blank(v: object) -> bool:
    return v is None or (isinstance(v, str) and not v.strip())


def fault_row_events(row: Mapping[str, Any], *, job_id: str | None = None,
                     default_tz: tzinfo = UTC) -> list[tuple[Discrete, tuple[Any, ...]]]:
    """One fault-log row -> its START (and END) events with a stable key each.

    Raises ``_RowFault`` (a ``ValueError``) naming the field when the row is bad.
    """
    r = _normalise_keys(row)
    for name in REQUIRED:
        if _blank(r.get(name)):
            raise _RowFault(name, "missing")
    for name in ("node", "fault_class"):
        if not isinstance(r[name], str):
            raise _RowFault(name, f"expected a string, got {type(r[name]).__name__}")
    node = r["node"].strip()
    fault_class = r["fault_class"].strip()
    try:
        start = parse_time_us(r["start"], default_tz)
    except ValueError as exc:
        raise _RowFault("start", str(exc)) from None
    end: int | None = None
    if not _blank(r.get("end")):
        try:
            end = parse_time_us(r["end"], default_tz)
        except ValueError as exc:
            raise _RowFault("end", str(exc)) from None
        if end < start:
            raise _RowFault("end", f"end {r['end']!r} is before start {r['start']!r}")
    code: int | None = None
    if not _blank(r.get("code")):
        raw = r["code"]
        if isinstance(raw, bool) or not (
            isinstance(raw, int) or (isinstance(raw, str) and re.fullmatch(r"-?[0-9]{1,12}",
                                                                         raw.strip()))):
            raise _RowFault("code", f"{raw!r} is not an integer")
        code = int(raw)
    message = "" if _blank(r.get("message")) else str(r["message"])[:4096]
    jid = job_id or f"node:{node}"
    if not _JOB_ID.match(jid) or len(jid) > 128:
        raise _RowFault("node", f"{node!r} cannot name a job id (letters, digits, ._:-)")
    try:
        subject = Subject(node=node)
        events = [(NodeHealthKind.EXTERNAL_FAULT_START, start)]
        if end is not None:
            events.append((NodeHealthKind.EXTERNAL_FAULT_END, end))
        out = []
        for kind, t in events:
            payload = NodeHealth(kind=kind, code=code, fault_class=fault_class, message=message,
                                 origin="import")
            out.append((Discrete(payload=payload, job_id=jid, event_time=t, subject=subject),
                        (node, fault_class, start, kind.value)))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or None
        raise _RowFault(loc, err["msg"]) from None
    return out


def import_fault_rows(rows: Iterable[tuple[int, Mapping[str, Any] | Malformed]], *,
                      job_id: str | None = None, default_tz: tzinfo = UTC) -> ImportResult:
    result, _ = _import_rows(rows, job_id=job_id, default_tz=default_tz, seen=None)
    return result


def _import_rows(rows: Iterable[tuple[int, Mapping[str, Any] | Malformed]], *,
                 job_id: str | None, default_tz: tzinfo,
                 seen: set[tuple[Any, ...]] | None) -> tuple[ImportResult, list[tuple[Any, ...]]]:
    result = ImportResult()
    keys: list[tuple[Any, ...]] = []
    for n, row in rows:
        if isinstance(row, Malformed):
            result.errors.append(RowError(n, None, row.reason))
            continue
        try:
            events = fault_row_events(row, job_id=job_id, default_tz=default_tz)
        except _RowFault as exc:
            result.errors.append(RowError(n, exc.field_name, exc.reason))
            continue
        for d, key in events:
            if seen is not None and key in seen:
                continue
            result.discrete.append(d)
            keys.append(key)
    return result, keys


def jsonl_rows(text: str) -> list[tuple[int, Mapping[str, Any] | Malformed]]:
    """JSON lines -> (line number, object | Malformed); blank and ``#`` lines are skipped."""
    out: list[tuple[int, Mapping[str, Any] | Malformed]] = []
    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        try:
            obj = json.loads(s)
        except ValueError as exc:
            out.append((n, Malformed(f"not JSON: {exc}")))
            continue
        if not isinstance(obj, dict):
            out.append((n, Malformed(f"expected a JSON object, got {type(obj).__name__}")))
            continue
        out.append((n, obj))
    return out


def csv_rows(text: str) -> list[tuple[int, Mapping[str, Any] | Malformed]]:
    """CSV with a header row -> (file line number, row | Malformed)."""
    out: list[tuple[int, Mapping[str, Any] | Malformed]] = []
    try:
        reader = csv.DictReader(io.StringIO(text), restkey="__extra__")
        for row in reader:
            n = reader.line_num
            if "__extra__" in row:
                out.append((n, Malformed("more values than header columns")))
                continue
            if all(_blank(v) for v in row.values()):
                continue
            out.append((n, row))
    except csv.Error as exc:
        out.append((-1, Malformed(f"CSV error: {exc}")))
    return out


def import_fault_log_text(text: str, fmt: str, *, job_id: str | None = None,
                          default_tz: tzinfo = UTC) -> ImportResult:
    """``fmt``: ``"jsonl"`` or ``"csv"``."""
    rows = jsonl_rows(text) if fmt == "jsonl" else csv_rows(text)
    result = import_fault_rows(rows, job_id=job_id, default_tz=default_tz)
    _log_errors(result.errors, fmt)
    return result


def fault_log_format(path: Path) -> str:
    return "csv" if path.suffix.lower() == ".csv" else "jsonl"


def import_fault_log(path: str | Path, *, job_id: str | None = None,
                     default_tz: tzinfo = UTC) -> ImportResult:
    p = Path(path)
    return import_fault_log_text(p.read_text(encoding="utf-8", errors="replace"),
                                 fault_log_format(p), job_id=job_id, default_tz=default_tz)


def _log_errors(errors: Sequence[RowError], what: str) -> None:
    if errors:
        log.warning("%s import: %d bad row(s), first: %s", what, len(errors), errors[0])


# --- Kubernetes node conditions -----------------------------------------------------------


def _nodes_of(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    if isinstance(obj.get("items"), list):
        return [n for n in obj["items"] if isinstance(n, Mapping)]
    return [obj]


def node_condition_events(obj: Mapping[str, Any] | str | bytes, *, job_id: str | None = None,
                          positive_conditions: Iterable[str] = DEFAULT_POSITIVE_CONDITIONS,
                          ) -> tuple[ImportResult, list[tuple[Any, ...]]]:
    """``kubectl get node(s) -o json`` -> NODE_CONDITION events for unhealthy conditions,
    with a key per event (node, type, status, lastTransitionTime)."""
    result = ImportResult(error_kind="node_condition")
    keys: list[tuple[Any, ...]] = []
    if isinstance(obj, str | bytes):
        try:
            obj = json.loads(obj)
        except ValueError as exc:
            result.errors.append(RowError(0, None, f"not JSON: {exc}", where="document"))
            return result, keys
    if not isinstance(obj, Mapping):
        result.errors.append(RowError(0, None, "expected a Node or a List object",
                                      where="document"))
        return result, keys
    positive = frozenset(positive_conditions)
    for i, node_obj in enumerate(_nodes_of(obj)):
        meta = node_obj.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            result.errors.append(RowError(i, "metadata.name", "missing", where=f"items[{i}]"))
            continue
        status = node_obj.get("status")
        conditions = status.get("conditions") if isinstance(status, Mapping) else None
        if conditions is None:
            continue
        if not isinstance(conditions, list):
            result.errors.append(RowError(i, "status.conditions", "not a list",
                                          where=f"node {name}"))
            continue
        jid = job_id or f"node:{name}"
        for j, cond in enumerate(conditions):
            where = f"node {name} .status.conditions[{j}]"
            try:
                ev = _condition_event(cond, name, jid, positive)
            except _RowFault as exc:
                result.errors.append(RowError(j, exc.field_name, exc.reason, where=where))
                continue
            if ev is not None:
                result.discrete.append(ev[0])
                keys.append(ev[1])
    _log_errors(result.errors, "node condition")
    return result, keys


def _condition_event(cond: object, node: str, job_id: str, positive: frozenset[str],
                     ) -> tuple[Discrete, tuple[Any, ...]] | None:
    if not isinstance(cond, Mapping):
        raise _RowFault(None, "condition is not an object")
    ctype, status = cond.get("type"), cond.get("status")
    if not isinstance(ctype, str) or not ctype:
        raise _RowFault("type", "missing")
    if status not in ("True", "False", "Unknown"):
        raise _RowFault("status", f"{status!r} is not True, False or Unknown")
    unhealthy = status != "True" if ctype in positive else status == "True"
    if not unhealthy:
        return None
    when = cond.get("lastTransitionTime") or cond.get("lastHeartbeatTime")
    try:
        t = parse_time_us(when)
    except ValueError as exc:
        raise _RowFault("lastTransitionTime", str(exc)) from None
    reason = cond.get("reason") or ""
    text = cond.get("message") or ""
    message = f"{ctype}={status}" + (f" ({reason})" if reason else "") + (
        f": {text}" if text else "")
    if not _JOB_ID.match(job_id):
        raise _RowFault("metadata.name", f"{node!r} cannot name a job id")
    payload = NodeHealth(kind=NodeHealthKind.NODE_CONDITION, fault_class=ctype,
                         message=message[:4096], origin="kubernetes")
    return (Discrete(payload=payload, job_id=job_id, event_time=t, subject=Subject(node=node)),
            (node, ctype, status, t))


# --- collectors ---------------------------------------------------------------------------


class FaultLogFollower:
    """A ``Collector`` over a fault-log file that grows or is rewritten in place: each
    ``collect`` re-reads it when it changed and reports only events not reported before (a
    row that gains its end later gives its END then). Bad rows are counted once each."""

    name = "fault_log"

    def __init__(self, path: str | Path, *, job_id: str | None = None,
                 default_tz: tzinfo = UTC) -> None:
        self.path = Path(path)
        self.fmt = fault_log_format(self.path)
        self.job_id = job_id
        self.default_tz = default_tz
        self._seen: set[tuple[Any, ...]] = set()
        self._errors_seen: set[RowError] = set()
        self._stamp: tuple[int, int] | None = None

    def collect(self, now_us: int) -> Reading:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return Reading()
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return Reading()
        self._stamp = stamp
        text = self.path.read_text(encoding="utf-8", errors="replace")
        rows = jsonl_rows(text) if self.fmt == "jsonl" else csv_rows(text)
        result, keys = _import_rows(rows, job_id=self.job_id, default_tz=self.default_tz,
                                    seen=self._seen)
        self._seen.update(keys)
        new_errors = [e for e in result.errors if e not in self._errors_seen]
        self._errors_seen.update(new_errors)
        _log_errors(new_errors, str(self.path))
        result.errors = new_errors
        return result.to_reading()


class NodeConditionCollector:
    """A ``Collector`` polling Kubernetes node conditions through ``fetch`` (returns the JSON
    of ``kubectl get node NAME -o json``, e.g. ``kubectl_fetch(NAME)``); each unhealthy
    transition is reported once."""

    name = "node_conditions"

    def __init__(self, fetch: Callable[[], Mapping[str, Any] | str | bytes], *,
                 job_id: str | None = None,
                 positive_conditions: Iterable[str] = DEFAULT_POSITIVE_CONDITIONS) -> None:
        self.fetch = fetch
        self.job_id = job_id
        self.positive_conditions = frozenset(positive_conditions)
        self._seen: set[tuple[Any, ...]] = set()

    def collect(self, now_us: int) -> Reading:
        try:
            doc = self.fetch()
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("node conditions: fetch failed: %s", exc)
            return Reading(malformed={"node_condition_fetch": 1})
        result, keys = node_condition_events(doc, job_id=self.job_id,
                                             positive_conditions=self.positive_conditions)
        reading = Reading(malformed=result.to_reading().malformed)
        for d, key in zip(result.discrete, keys, strict=True):
            if key not in self._seen:
                self._seen.add(key)
                reading.discrete.append(d)
        return reading


def kubectl_fetch(node: str, kubectl: str = "kubectl", timeout_s: float = 10.0,
                  ) -> Callable[[], bytes]:
    """A ``fetch`` for ``NodeConditionCollector``: ``kubectl get node NODE -o json``."""
    def fetch() -> bytes:
        return subprocess.run([kubectl, "get", "node", node, "-o", "json"], check=True,
                              capture_output=True, timeout=timeout_s).stdout
    return fetch
