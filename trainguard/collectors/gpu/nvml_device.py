"""Everything NVML says about one GPU, as the plain field dict ``build_sample`` takes.

Signatures are nvidia-ml-py's (pynvml 12.x/13.x): power in mW, memory in bytes, ECC counts via
``nvmlDeviceGetTotalEccErrors(h, errorType, counterType)``, remapped rows as a 4-tuple,
NVLink state per link, field values for memory temperature, NVLink totals and the GPU
recovery action.
"""

from __future__ import annotations

from typing import Any

from trainguard.collectors.gpu.names import decode_throttle, recovery_action_name
from trainguard.collectors.gpu.nvml_calls import (
    NvmlCalls,
    field_values,
    to_float,
    to_int,
    to_str,
)

MIB = 1024 * 1024

# NVML_FI_* field ids (nvml.h; same numbers in pynvml).
FI_DEV_MEMORY_TEMP = 82
FI_NVLINK_CRC_FLIT_TOTAL = 38
FI_NVLINK_CRC_DATA_TOTAL = 45
FI_NVLINK_REPLAY_TOTAL = 52
FI_NVLINK_RECOVERY_TOTAL = 59
FI_NVLINK_LINK_COUNT = 91
FI_GPU_RECOVERY_ACTION = 230


def _fields(calls: NvmlCalls) -> dict[str, int]:
    c = calls.const
    return {
        "mem_temp": c("NVML_FI_DEV_MEMORY_TEMP", FI_DEV_MEMORY_TEMP),
        "crc_flit": c("NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", FI_NVLINK_CRC_FLIT_TOTAL),
        "crc_data": c("NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", FI_NVLINK_CRC_DATA_TOTAL),
        "replay": c("NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", FI_NVLINK_REPLAY_TOTAL),
        "recovery": c("NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", FI_NVLINK_RECOVERY_TOTAL),
        "link_count": c("NVML_FI_DEV_NVLINK_LINK_COUNT", FI_NVLINK_LINK_COUNT),
        "recovery_action": c("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", FI_GPU_RECOVERY_ACTION),
    }


def identity(calls: NvmlCalls, handle: Any) -> dict[str, Any]:
    pci = calls.call("nvmlDeviceGetPciInfo", handle)
    bus = to_str(getattr(pci, "busId", None)) if pci is not None else None
    return {
        "uuid": to_str(calls.call("nvmlDeviceGetUUID", handle)),
        "model": to_str(calls.call("nvmlDeviceGetName", handle)),
        "pci_bus_id": bus,
    }


def read_device(calls: NvmlCalls, handle: Any, index: int,
                ident: dict[str, Any] | None = None) -> dict[str, Any]:
    """All fields of one GPU; each one NVML cannot give is None (or absent)."""
    nv = calls.nvml
    c = calls.const
    ident = ident if ident is not None else identity(calls, handle)
    out: dict[str, Any] = {"index": index, **ident}
    fid = _fields(calls)
    fv = field_values(calls, handle, list(fid.values()))

    out["temperature_c"] = to_float(
        calls.call("nvmlDeviceGetTemperature", handle, c("NVML_TEMPERATURE_GPU", 0)))
    out["memory_temperature_c"] = fv.get(fid["mem_temp"])
    power = to_float(calls.call("nvmlDeviceGetPowerUsage", handle))
    out["power_w"] = power / 1000.0 if power is not None else None
    limit = to_float(calls.call("nvmlDeviceGetEnforcedPowerLimit", handle))
    out["power_limit_w"] = limit / 1000.0 if limit is not None else None

    util = calls.call("nvmlDeviceGetUtilizationRates", handle)
    if util is not None:
        out["sm_util_pct"] = to_float(getattr(util, "gpu", None))
        out["mem_util_pct"] = to_float(getattr(util, "memory", None))

    # v2 splits "reserved" out of "used" (what nvidia-smi shows); v1 counts it as used.
    v2 = getattr(nv, "nvmlMemory_v2", None)
    mem = None
    if v2 is not None:
        try:
            mem = calls.call("nvmlDeviceGetMemoryInfo", handle, version=v2)
        except TypeError:  # a binding without the version argument
            mem = None
    if mem is None:
        mem = calls.call("nvmlDeviceGetMemoryInfo", handle)
    if mem is not None:
        used, total = to_float(getattr(mem, "used", None)), to_float(getattr(mem, "total", None))
        out["fb_used_mib"] = used / MIB if used is not None else None
        out["fb_total_mib"] = total / MIB if total is not None else None

    out["sm_clock_mhz"] = to_float(calls.call("nvmlDeviceGetClockInfo", handle,
                                              c("NVML_CLOCK_SM", 1)))
    out["mem_clock_mhz"] = to_float(calls.call("nvmlDeviceGetClockInfo", handle,
                                               c("NVML_CLOCK_MEM", 2)))
    mask = to_int(calls.first(("nvmlDeviceGetCurrentClocksEventReasons",
                               "nvmlDeviceGetCurrentClocksThrottleReasons"), handle))
    if mask is not None:
        out["throttle_reasons"] = decode_throttle(mask)

    corrected = c("NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
    uncorrected = c("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
    volatile, aggregate = c("NVML_VOLATILE_ECC", 0), c("NVML_AGGREGATE_ECC", 1)
    for key, etype, ctype in (("ecc_sbe_volatile", corrected, volatile),
                              ("ecc_dbe_volatile", uncorrected, volatile),
                              ("ecc_sbe_aggregate", corrected, aggregate),
                              ("ecc_dbe_aggregate", uncorrected, aggregate)):
        out[key] = to_int(calls.call("nvmlDeviceGetTotalEccErrors", handle, etype, ctype))

    rows = calls.call("nvmlDeviceGetRemappedRows", handle)
    if isinstance(rows, (tuple, list)) and len(rows) == 4:
        corr, unc, pending, failure = (to_int(v) for v in rows)
        out["remapped_rows_correctable"] = corr
        out["remapped_rows_uncorrectable"] = unc
        out["remapped_rows_pending"] = bool(pending) if pending is not None else None
        out["remapped_rows_failure"] = bool(failure) if failure is not None else None

    out["pcie_replay_count"] = to_int(calls.call("nvmlDeviceGetPcieReplayCounter", handle))
    out.update(read_nvlink(calls, handle, fv, fid))
    action = fv.get(fid["recovery_action"])
    if action is not None and action.is_integer():
        out["recovery_action"] = recovery_action_name(int(action))
    return out


def read_nvlink(calls: NvmlCalls, handle: Any, fv: dict[int, float],
                fid: dict[str, int]) -> dict[str, Any]:
    """Links up/total and error totals. Totals come from the all-lanes field values; where
    those are unsupported, the per-link DL counters of the links that exist are summed."""
    c = calls.const
    max_links = c("NVML_NVLINK_MAX_LINKS", 18)
    count = fv.get(fid["link_count"])
    n_links = int(count) if count is not None and 0 <= count <= max_links else max_links
    states: list[int] = []
    for link in range(n_links):
        state = to_int(calls.call("nvmlDeviceGetNvLinkState", handle, link))
        if state is None:
            if count is None:
                break  # no link count: the first link that does not answer ends the list
            continue
        states.append(link if state == c("NVML_FEATURE_ENABLED", 1) else -1)
    if not states:
        return {}
    up = [link for link in states if link >= 0]
    out: dict[str, Any] = {"nvlink_links_up": len(up),
                           "nvlink_links_total": n_links if count is not None else len(states)}

    def total(*keys: str) -> int | None:
        vals = [fv.get(fid[k]) for k in keys]
        if any(v is None for v in vals):
            return None
        return int(sum(v for v in vals if v is not None))

    def per_link(*counters: int) -> int | None:
        got = [to_int(calls.call("nvmlDeviceGetNvLinkErrorCounter", handle, link, ctr))
               for link in up for ctr in counters]
        known = [g for g in got if g is not None]
        return sum(known) if known else None

    crc = total("crc_flit", "crc_data")
    out["nvlink_crc_errors"] = crc if crc is not None else per_link(
        c("NVML_NVLINK_ERROR_DL_CRC_FLIT", 2), c("NVML_NVLINK_ERROR_DL_CRC_DATA", 3))
    replay = total("replay")
    out["nvlink_replay_errors"] = replay if replay is not None else per_link(
        c("NVML_NVLINK_ERROR_DL_REPLAY", 0))
    recovery = total("recovery")
    out["nvlink_recovery_errors"] = recovery if recovery is not None else per_link(
        c("NVML_NVLINK_ERROR_DL_RECOVERY", 1))
    return out
