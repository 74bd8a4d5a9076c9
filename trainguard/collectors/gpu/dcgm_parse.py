"""dcgm-exporter ``/metrics`` text -> typed series -> ``GpuSample`` per GPU. Pure, no I/O.

Sample lines are parsed by ``prometheus_client.parser.text_string_to_metric_families``. The
text is fed to it one sample line at a time, each with the ``# HELP`` / ``# TYPE`` lines of its
family, so one bad line costs only that line (the library aborts a whole text at the first
error). A series' kind is its ``# TYPE``; scrapes without TYPE lines (some exporters' text, or
a copied recording) fall back to the kind dcgm-exporter's own metric CSVs give the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families

from trainguard.collectors.gpu.blanks import is_dcgm_blank
from trainguard.collectors.gpu.names import decode_throttle, recovery_action_name
from trainguard.collectors.gpu.sample import build_sample, bump
from trainguard.events.payloads import GpuSample

Kind = Literal["counter", "gauge", "unknown"]

# From dcgm-exporter etc/default-counters.csv and etc/dcp-metrics-included.csv (and the
# commented-out entries there), for scrapes that carry no ``# TYPE`` lines.
DCGM_KINDS: dict[str, Kind] = {
    "DCGM_FI_DEV_SM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEM_CLOCK": "gauge",
    "DCGM_FI_DEV_MEMORY_TEMP": "gauge",
    "DCGM_FI_DEV_GPU_TEMP": "gauge",
    "DCGM_FI_DEV_POWER_USAGE": "gauge",
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": "gauge",
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": "gauge",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": "counter",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "gauge",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "gauge",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "counter",
    "DCGM_FI_DEV_GPU_UTIL": "gauge",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "gauge",
    "DCGM_FI_DEV_ENC_UTIL": "gauge",
    "DCGM_FI_DEV_DEC_UTIL": "gauge",
    "DCGM_FI_DEV_XID_ERRORS": "gauge",
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": "gauge",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "gauge",
    "DCGM_FI_DEV_POWER_VIOLATION": "counter",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "counter",
    "DCGM_FI_DEV_SYNC_BOOST_VIOLATION": "counter",
    "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION": "counter",
    "DCGM_FI_DEV_LOW_UTIL_VIOLATION": "counter",
    "DCGM_FI_DEV_RELIABILITY_VIOLATION": "counter",
    "DCGM_EXP_CLOCK_EVENTS_COUNT": "counter",
    "DCGM_EXP_XID_ERRORS_COUNT": "counter",
    "DCGM_EXP_GPU_HEALTH_STATUS": "counter",
    "DCGM_EXP_P2P_STATUS": "counter",
    "DCGM_FI_DEV_FB_TOTAL": "gauge",
    "DCGM_FI_DEV_FB_FREE": "gauge",
    "DCGM_FI_DEV_FB_USED": "gauge",
    "DCGM_FI_DEV_FB_RESERVED": "gauge",
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "counter",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "counter",
    "DCGM_FI_DEV_RETIRED_SBE": "counter",
    "DCGM_FI_DEV_RETIRED_DBE": "counter",
    "DCGM_FI_DEV_RETIRED_PENDING": "counter",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "counter",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_L0": "counter",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "gauge",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "counter",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "gauge",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "gauge",
    "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION": "gauge",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gauge",
    "DCGM_FI_PROF_SM_ACTIVE": "gauge",
    "DCGM_FI_PROF_SM_OCCUPANCY": "gauge",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "gauge",
    "DCGM_FI_PROF_DRAM_ACTIVE": "gauge",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": "gauge",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": "gauge",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": "gauge",
    "DCGM_FI_PROF_NVLINK_TX_BYTES": "gauge",
    "DCGM_FI_PROF_NVLINK_RX_BYTES": "gauge",
}

_TYPES: dict[str, Kind] = {"counter": "counter", "gauge": "gauge"}


@dataclass(frozen=True)
class DcgmSeries:
    """One DCGM sample: field name, kind, value and the labels that say which GPU it is."""

    name: str
    kind: Kind
    value: float
    gpu: int
    uuid: str | None = None
    model: str | None = None
    hostname: str | None = None
    pci_bus_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass
class DcgmScrape:
    series: list[DcgmSeries] = field(default_factory=list)
    malformed: dict[str, int] = field(default_factory=dict)
    first_bad: dict[str, str] = field(default_factory=dict)  # kind -> first offending text

    @property
    def counters(self) -> list[DcgmSeries]:
        return [s for s in self.series if s.kind == "counter"]

    @property
    def gauges(self) -> list[DcgmSeries]:
        return [s for s in self.series if s.kind == "gauge"]

    def bad(self, kind: str, text: str) -> None:
        bump(self.malformed, kind)
        self.first_bad.setdefault(kind, text)


def _header_name(line: str) -> tuple[str, str] | None:
    """``# HELP name ...`` / ``# TYPE name ...`` -> (keyword, name); other comments -> None."""
    parts = line.split(None, 3)
    if len(parts) >= 3 and parts[0] == "#" and parts[1] in ("HELP", "TYPE"):
        return parts[1], parts[2]
    return None


def _families(text: str) -> list[tuple[str, str, list[tuple[str, dict[str, str], float]]]]:
    out = []
    for fam in text_string_to_metric_families(text):
        out.append((fam.name, fam.type, [(s.name, dict(s.labels), s.value) for s in fam.samples]))
    return out


def parse_dcgm_text(text: str) -> DcgmScrape:
    """Every ``DCGM_*`` series in a scrape; bad lines, blanks and unlabelled series counted."""
    scrape = DcgmScrape()
    header: list[str] = []
    header_name = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            hn = _header_name(line)
            if hn is None:
                continue
            if hn[1] != header_name:
                header, header_name = [], hn[1]
            header.append(line)
            try:
                _families("\n".join(header) + "\n")
            except Exception:
                scrape.bad("prom_comment", line)
                header, header_name = [], ""
            continue
        try:
            families = _families("\n".join([*header, line]) + "\n")
        except Exception:
            scrape.bad("prom_line", line)
            continue
        for fam_name, fam_type, samples in families:
            for _sample_name, labels, value in samples:
                _add(scrape, fam_name, fam_type, labels, value, line)
    return scrape


def _add(scrape: DcgmScrape, name: str, typ: str, labels: dict[str, str], value: float,
         line: str) -> None:
    if not name.startswith("DCGM_"):
        return
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        scrape.bad("dcgm_nonfinite", line)
        return
    if is_dcgm_blank(value):
        scrape.bad("dcgm_blank", line)
        return
    value = float(value)
    gpu_text = labels.get("gpu", "")
    if not gpu_text.isdigit():
        scrape.bad("dcgm_no_gpu_label", line)
        return
    kind: Kind = _TYPES.get(typ) or DCGM_KINDS.get(name, "unknown")
    scrape.series.append(DcgmSeries(
        name=name, kind=kind, value=value, gpu=int(gpu_text),
        uuid=labels.get("UUID") or None, model=labels.get("modelName") or None,
        hostname=labels.get("Hostname") or None, pci_bus_id=labels.get("pci_bus_id") or None,
        labels=labels))


# --- series -> GpuSample ---------------------------------------------------------------------

_FLOAT_FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_GPU_UTIL": "sm_util_pct",
    "DCGM_FI_DEV_MEM_COPY_UTIL": "mem_util_pct",
    "DCGM_FI_DEV_FB_USED": "fb_used_mib",
    "DCGM_FI_DEV_FB_TOTAL": "fb_total_mib",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_MEM_CLOCK": "mem_clock_mhz",
}
_COUNT_FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": "ecc_sbe_volatile",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe_volatile",
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": "ecc_sbe_aggregate",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": "ecc_dbe_aggregate",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "remapped_rows_correctable",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "remapped_rows_uncorrectable",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "nvlink_replay_errors",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "nvlink_recovery_errors",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "pcie_replay_count",
}
_BOOL_FIELDS: dict[str, str] = {
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "remapped_rows_failure",
    "DCGM_FI_DEV_ROW_REMAP_PENDING": "remapped_rows_pending",
}
_CRC = ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL")
_THROTTLE = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
_POWER_LIMIT = ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", "DCGM_FI_DEV_POWER_MGMT_LIMIT")


def _as_count(value: float) -> int | None:
    return int(value) if value >= 0 and value.is_integer() else None


def to_gpu_samples(scrape: DcgmScrape) -> list[GpuSample]:
    """One ``GpuSample`` per ``gpu`` label, in index order. Adds to ``scrape.malformed``.

    A field seen twice for one GPU (MIG instances, a second exporter) keeps its first value
    and counts ``dcgm_duplicate``. Memory temperature 0 is taken as "no sensor" (GDDR boards
    such as T4/L4/L40S report 0, nvidia-smi shows N/A there). Total framebuffer is
    ``FB_TOTAL`` if exported, else used + free + reserved.
    """
    by_gpu: dict[int, dict[str, DcgmSeries]] = {}
    for s in scrape.series:
        fields = by_gpu.setdefault(s.gpu, {})
        key = s.name if s.name != "DCGM_EXP_XID_ERRORS_COUNT" else f"{s.name}/{s.labels.get('xid')}"
        if key in fields:
            bump(scrape.malformed, "dcgm_duplicate")
            continue
        fields[key] = s
    return [sample for gpu in sorted(by_gpu)
            if (sample := _one_gpu(gpu, by_gpu[gpu], scrape.malformed)) is not None]


def _one_gpu(gpu: int, series: dict[str, DcgmSeries],
             malformed: dict[str, int]) -> GpuSample | None:
    def val(name: str) -> float | None:
        s = series.get(name)
        return s.value if s is not None else None

    def label(attr: str) -> str | None:
        return next((v for s in series.values() if (v := getattr(s, attr)) is not None), None)

    out: dict[str, Any] = {"index": gpu, "uuid": label("uuid"), "model": label("model"),
                           "pci_bus_id": label("pci_bus_id")}
    for name, f in _FLOAT_FIELDS.items():
        if (v := val(name)) is not None:
            out[f] = _plausible(f, v, malformed)
    for name, f in _COUNT_FIELDS.items():
        if (v := val(name)) is not None:
            out[f] = _counted(v, malformed)
    for name, f in _BOOL_FIELDS.items():
        if (v := val(name)) is not None:
            out[f] = v != 0
    mem_temp = val("DCGM_FI_DEV_MEMORY_TEMP")
    if mem_temp is not None and mem_temp != 0:
        out["memory_temperature_c"] = _plausible("memory_temperature_c", mem_temp, malformed)
    limit = next((v for n in _POWER_LIMIT if (v := val(n)) is not None), None)
    if limit is not None:
        out["power_limit_w"] = limit
    if "fb_total_mib" not in out:
        used, free = val("DCGM_FI_DEV_FB_USED"), val("DCGM_FI_DEV_FB_FREE")
        if used is not None and free is not None:
            out["fb_total_mib"] = used + free + (val("DCGM_FI_DEV_FB_RESERVED") or 0.0)
    crc = [v for n in _CRC if (v := val(n)) is not None]
    if crc:
        parts = [_counted(v, malformed) for v in crc]
        out["nvlink_crc_errors"] = None if None in parts else sum(p or 0 for p in parts)
    mask = next((v for n in _THROTTLE if (v := val(n)) is not None), None)
    if mask is not None and (m := _counted(mask, malformed)) is not None:
        out["throttle_reasons"] = decode_throttle(m)
    out["xids"] = _xids(series, malformed)
    action = val("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION")
    if action is not None and (a := _counted(action, malformed)) is not None:
        out["recovery_action"] = recovery_action_name(a)
    return build_sample(out, malformed, "dcgm")


# Physical bounds of a reading: a sensor value outside them (a garbled line, a blank of a type
# the text does not name) is no reading, counted ``dcgm_implausible``, never a temperature.
_BOUNDS = {"temperature_c": (-40.0, 200.0), "memory_temperature_c": (-40.0, 200.0)}


def _plausible(field: str, value: float, malformed: dict[str, int]) -> float | None:
    bounds = _BOUNDS.get(field)
    if bounds is None or bounds[0] <= value <= bounds[1]:
        return value
    bump(malformed, "dcgm_implausible")
    return None


def _counted(value: float, malformed: dict[str, int]) -> int | None:
    n = _as_count(value)
    if n is None:
        bump(malformed, "dcgm_not_a_count")
    return n


def _xids(series: dict[str, DcgmSeries], malformed: dict[str, int]) -> list[int]:
    xids: list[int] = []
    last = series.get("DCGM_FI_DEV_XID_ERRORS")
    if last is not None and (code := _counted(last.value, malformed)):
        xids.append(code)
    for key, s in series.items():
        if key.startswith("DCGM_EXP_XID_ERRORS_COUNT/") and s.value > 0:
            code_text = s.labels.get("xid", "")
            if code_text.isdigit() and int(code_text) not in xids:
                xids.append(int(code_text))
    return xids

