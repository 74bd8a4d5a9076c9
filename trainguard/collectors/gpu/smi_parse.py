"""nvidia-smi output -> field dicts -> ``GpuSample``. Pure, no I/O.

Two formats:

- ``nvidia-smi -q -x`` (XML, DTD v10..v12+): tags moved between versions
  (``power_readings`` -> ``gpu_power_readings``, ``clocks_throttle_reasons`` ->
  ``clocks_event_reasons``, ECC ``single_bit``/``double_bit`` -> ``sram_*``/``dram_*``), so
  each value is looked up by its known paths, newest first. The GPU index is the position of
  the ``<gpu>`` element (nvidia-smi lists GPUs in index order; the XML has no index tag).
- ``nvidia-smi --query-gpu=... --format=csv`` (with or without ``nounits``): columns by header
  name, units stripped; ``[N/A]``, ``N/A``, ``[Not Supported]``, ``[Requested functionality has
  been deprecated]``... are None.
"""

from __future__ import annotations

import csv
import io
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

from trainguard.collectors.gpu.names import (
    THROTTLE_NAMES,
    decode_throttle,
    recovery_action_from_text,
)
from trainguard.collectors.gpu.sample import build_sample, bump
from trainguard.events.payloads import GpuSample

_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%/]*)\s*$")


@dataclass
class SmiParse:
    gpus: list[GpuSample] = field(default_factory=list)
    malformed: dict[str, int] = field(default_factory=dict)


def smi_number(text: str | None) -> float | None:
    """``"67.03 W"``, ``"81920 MiB"``, ``"27 C"``, ``"0 %"``, ``"12"`` -> float; N/A -> None."""
    if text is None:
        return None
    m = _NUMBER.match(text)
    return float(m.group(1)) if m else None


def smi_int(text: str | None) -> int | None:
    t = (text or "").strip()
    if re.fullmatch(r"0[xX][0-9a-fA-F]+", t):
        return int(t, 16)
    v = smi_number(t)
    return int(v) if v is not None and v.is_integer() and v >= 0 else None


def smi_bool(text: str | None) -> bool | None:
    t = (text or "").strip().lower()
    if t in ("yes", "true", "1", "active", "enabled"):
        return True
    if t in ("no", "false", "0", "not active", "disabled"):
        return False
    return None


def smi_text(text: str | None) -> str | None:
    t = (text or "").strip()
    if not t or t.strip("[]").lower() in ("n/a", "not supported", "unknown error"):
        return None
    if t.startswith("[") and t.endswith("]"):  # "[Requested functionality has been deprecated]"
        return None
    return t


# --- XML -------------------------------------------------------------------------------------


def _find(gpu: ET.Element, *paths: str) -> str | None:
    for path in paths:
        el = gpu.find(path)
        if el is not None and el.text is not None and smi_text(el.text) is not None:
            return el.text.strip()
    return None


def _sum_ints(gpu: ET.Element, *paths: str) -> int | None:
    vals = [smi_int(_find(gpu, p)) for p in paths]
    known = [v for v in vals if v is not None]
    return sum(known) if known else None


def _xml_throttle(gpu: ET.Element) -> list[str]:
    for tag, prefix in (("clocks_event_reasons", "clocks_event_reason_"),
                        ("clocks_throttle_reasons", "clocks_throttle_reason_")):
        block = gpu.find(tag)
        if block is None:
            continue
        names = []
        for child in block:
            if (child.text or "").strip() == "Active" and child.tag.startswith(prefix):
                name = child.tag[len(prefix):]
                names.append(name if name in THROTTLE_NAMES else f"other_{name}")
        return names
    return []


def xml_gpu_fields(gpu: ET.Element, index: int) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": index,
        "uuid": _find(gpu, "uuid"),
        "model": _find(gpu, "product_name"),
        "pci_bus_id": _find(gpu, "pci/pci_bus_id") or smi_text(gpu.get("id")),
        "temperature_c": smi_number(_find(gpu, "temperature/gpu_temp")),
        "memory_temperature_c": smi_number(_find(gpu, "temperature/memory_temp")),
        "power_w": smi_number(_find(
            gpu, "gpu_power_readings/power_draw", "gpu_power_readings/instant_power_draw",
            "gpu_power_readings/average_power_draw", "power_readings/power_draw")),
        "power_limit_w": smi_number(_find(
            gpu, "gpu_power_readings/current_power_limit", "power_readings/enforced_power_limit",
            "power_readings/power_limit")),
        "sm_util_pct": smi_number(_find(gpu, "utilization/gpu_util")),
        "mem_util_pct": smi_number(_find(gpu, "utilization/memory_util")),
        "fb_used_mib": smi_number(_find(gpu, "fb_memory_usage/used")),
        "fb_total_mib": smi_number(_find(gpu, "fb_memory_usage/total")),
        "sm_clock_mhz": smi_number(_find(gpu, "clocks/sm_clock")),
        "mem_clock_mhz": smi_number(_find(gpu, "clocks/mem_clock")),
        "throttle_reasons": _xml_throttle(gpu),
        "pcie_replay_count": smi_int(_find(gpu, "pci/replay_counter")),
        "remapped_rows_correctable": smi_int(_find(gpu, "remapped_rows/remapped_row_corr")),
        "remapped_rows_uncorrectable": smi_int(_find(gpu, "remapped_rows/remapped_row_unc")),
        "remapped_rows_pending": smi_bool(_find(gpu, "remapped_rows/remapped_row_pending")),
        "remapped_rows_failure": smi_bool(_find(gpu, "remapped_rows/remapped_row_failure")),
    }
    for scope, key in (("volatile", "volatile"), ("aggregate", "aggregate")):
        base = f"ecc_errors/{scope}"
        sbe = _sum_ints(gpu, f"{base}/sram_correctable", f"{base}/dram_correctable")
        dbe = _sum_ints(gpu, f"{base}/sram_uncorrectable", f"{base}/dram_uncorrectable",
                        f"{base}/sram_uncorrectable_parity",
                        f"{base}/sram_uncorrectable_secded")
        if sbe is None:  # DTD <= v10: single_bit / double_bit totals
            sbe = smi_int(_find(gpu, f"{base}/single_bit/total"))
            dbe = smi_int(_find(gpu, f"{base}/double_bit/total"))
        out[f"ecc_sbe_{key}"] = sbe
        out[f"ecc_dbe_{key}"] = dbe
    action = _find(gpu, "gpu_recovery_action")
    if action is not None:
        out["recovery_action"] = recovery_action_from_text(action)
    return out


def parse_smi_xml(text: str) -> SmiParse:
    """Every ``<gpu>`` of one ``nvidia-smi -q -x`` document; unparsable XML counts ``smi_xml``."""
    result = SmiParse()
    try:
        root = ET.fromstring(text)
    except ET.ParseError:
        bump(result.malformed, "smi_xml")
        return result
    for index, gpu in enumerate(root.findall("gpu")):
        sample = build_sample(xml_gpu_fields(gpu, index), result.malformed, "smi")
        if sample is not None:
            result.gpus.append(sample)
    return result


# --- CSV -------------------------------------------------------------------------------------

# query-gpu field -> GpuSample field, for the plain numeric ones.
CSV_FLOATS: dict[str, str] = {
    "temperature.gpu": "temperature_c",
    "temperature.memory": "memory_temperature_c",
    "power.draw": "power_w",
    "utilization.gpu": "sm_util_pct",
    "utilization.memory": "mem_util_pct",
    "memory.used": "fb_used_mib",
    "memory.total": "fb_total_mib",
    "clocks.current.sm": "sm_clock_mhz",
    "clocks.sm": "sm_clock_mhz",
    "clocks.current.memory": "mem_clock_mhz",
    "clocks.mem": "mem_clock_mhz",
}
CSV_INTS: dict[str, str] = {
    "ecc.errors.corrected.volatile.total": "ecc_sbe_volatile",
    "ecc.errors.uncorrected.volatile.total": "ecc_dbe_volatile",
    "ecc.errors.corrected.aggregate.total": "ecc_sbe_aggregate",
    "ecc.errors.uncorrected.aggregate.total": "ecc_dbe_aggregate",
    "remapped_rows.correctable": "remapped_rows_correctable",
    "remapped_rows.uncorrectable": "remapped_rows_uncorrectable",
}
CSV_BOOLS: dict[str, str] = {
    "remapped_rows.pending": "remapped_rows_pending",
    "remapped_rows.failure": "remapped_rows_failure",
}
POWER_LIMIT_COLUMNS = ("enforced.power.limit", "power.limit")
THROTTLE_COLUMNS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")

# What the nvidia-smi source asks for (every one of these exists since driver 510 or so;
# older names are the fallback list).
QUERY_FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "temperature.gpu", "temperature.memory",
    "power.draw", "enforced.power.limit", "utilization.gpu", "utilization.memory",
    "memory.used", "memory.total", "clocks.current.sm", "clocks.current.memory",
    "clocks_event_reasons.active", "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.corrected.aggregate.total",
    "ecc.errors.uncorrected.aggregate.total", "remapped_rows.correctable",
    "remapped_rows.uncorrectable", "remapped_rows.pending", "remapped_rows.failure",
    "gpu_recovery_action",
)
QUERY_FIELDS_OLD = (
    "index", "uuid", "name", "pci.bus_id", "temperature.gpu", "power.draw",
    "enforced.power.limit", "utilization.gpu", "utilization.memory", "memory.used",
    "memory.total", "clocks.sm", "clocks.mem", "clocks_throttle_reasons.active",
    "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total", "ecc.errors.uncorrected.aggregate.total",
)


def _column(header: str) -> str:
    """``"memory.total [MiB]"`` -> ``"memory.total"``."""
    return header.split("[", 1)[0].strip()


def csv_row_fields(row: dict[str, str], position: int) -> dict[str, Any]:
    index = smi_int(row.get("index"))
    out: dict[str, Any] = {
        "index": index if index is not None else position,
        "uuid": smi_text(row.get("uuid")),
        "model": smi_text(row.get("name")),
        "pci_bus_id": smi_text(row.get("pci.bus_id")),
    }
    for col, key in CSV_FLOATS.items():
        if col in row and key not in out:
            out[key] = smi_number(row[col])
    for col, key in CSV_INTS.items():
        if col in row:
            out[key] = smi_int(row[col])
    for col, key in CSV_BOOLS.items():
        if col in row:
            out[key] = smi_bool(row[col])
    out["power_limit_w"] = next((v for c in POWER_LIMIT_COLUMNS
                                 if (v := smi_number(row.get(c))) is not None), None)
    mask = next((v for c in THROTTLE_COLUMNS if (v := smi_int(row.get(c))) is not None), None)
    if mask is not None:
        out["throttle_reasons"] = decode_throttle(mask)
    action = smi_text(row.get("gpu_recovery_action"))
    if action is not None:
        out["recovery_action"] = recovery_action_from_text(action)
    return out


def parse_smi_csv(text: str, columns: list[str] | None = None) -> SmiParse:
    """``--query-gpu`` CSV. ``columns``: the queried fields when the text has no header
    (``noheader``); otherwise the first line is the header."""
    result = SmiParse()
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    rows = [r for r in rows if r and any(cell.strip() for cell in r)]
    if columns is None:
        if not rows:
            return result
        columns = [_column(h) for h in rows[0]]
        rows = rows[1:]
    for position, cells in enumerate(rows):
        if len(cells) != len(columns):
            bump(result.malformed, "smi_csv_row")
            continue
        row = dict(zip(columns, (c.strip() for c in cells), strict=True))
        sample = build_sample(csv_row_fields(row, position), result.malformed, "smi")
        if sample is not None:
            result.gpus.append(sample)
    return result
