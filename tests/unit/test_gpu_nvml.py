"""The NVML source against a small recorded fake (values of the A100 and T4 recordings), with
unsupported calls, an Xid event, a lost GPU; the fake checked against nvidia-ml-py's
signatures; and the real pynvml wrappers driven over a fake libnvidia-ml (ctypes level)."""

from __future__ import annotations

import ctypes
import inspect
import io
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from trainguard.collectors.base import Collector
from trainguard.collectors.gpu import DcgmExporterCollector, NvidiaSmiCollector, check
from trainguard.collectors.gpu.nvml_source import NvmlCollector
from trainguard.events.payloads import NodeHealth, NodeHealthKind

MIB = 1024 * 1024

# NVML return codes (nvml.h)
NOT_SUPPORTED, NO_PERMISSION, TIMEOUT, LIB_NOT_FOUND, GPU_LOST = 3, 4, 10, 12, 15


class FakeNvmlError(Exception):
    """Like pynvml.NVMLError: ``.value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


# Recorded per-GPU values: GPU 0 from telegraf_a100-sxm4-v12.xml (plus NVLink, which -q -x
# does not show), GPU 1 from telegraf_tesla-t4.xml. NVML units: mW, bytes, MHz, C.
GPUS: list[dict[str, Any]] = [
    {"name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-513536b6-7d19-9063-b049-1e69664bb298",
     "bus": b"00000000:01:00.0", "temp": 27, "power_mw": 67030, "limit_mw": 500000,
     "util": (0, 0), "mem": (81920 * MIB, 50 * MIB), "clocks": {1: 1275, 2: 1593},
     "reasons": 0x1 | 0x4, "ecc": {(0, 0): 0, (1, 0): 0, (0, 1): 3, (1, 1): 0},
     "rows": (1, 0, 0, 0), "replay": 0, "links": [1] * 11 + [0],
     "fields": {82: 44, 38: 2, 45: 1, 52: 5, 59: 0, 91: 12, 230: 1}},
    {"name": "Tesla T4", "uuid": "GPU-d37e67a5-91dd-3774-a5cb-99096249601a",
     "bus": b"00000000:00:1E.0", "temp": 40, "power_mw": 26780, "limit_mw": 70000,
     "util": (0, 0), "mem": (15360 * MIB, 1032 * MIB), "clocks": {1: 585, 2: 5000},
     "reasons": None, "ecc": {(0, 0): 0, (1, 0): 0}, "rows": None, "replay": 0,
     "links": None, "fields": {}},
]


class FakeNvml:
    """A module-like NVML binding: pynvml's function names, argument order and units."""

    NVMLError = FakeNvmlError
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 18
    nvmlEventTypeXidCriticalError = 0x8
    NVML_FI_DEV_MEMORY_TEMP = 82
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230

    def __init__(self, gpus: list[dict[str, Any]] | None = None, init_error: int | None = None
                 ) -> None:
        self.gpus = gpus if gpus is not None else [dict(g) for g in GPUS]
        self.init_error = init_error
        self.events: list[tuple[int, int, int]] = []  # (gpu, eventType, eventData)
        self.waits: list[int] = []
        self.registered: list[int] = []
        self.lost: set[int] = set()
        self.log: list[str] = []

    def _gpu(self, handle: int) -> dict[str, Any]:
        if handle in self.lost:
            raise FakeNvmlError(GPU_LOST)
        return self.gpus[handle]

    def _get(self, handle: int, key: str) -> Any:
        value = self._gpu(handle)[key]
        if value is None:
            raise FakeNvmlError(NOT_SUPPORTED)
        return value

    def nvmlInit(self) -> None:
        self.log.append("init")
        if self.init_error is not None:
            raise FakeNvmlError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.log.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetName(self, handle: int) -> str:
        return str(self._get(handle, "name"))

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return str(self._get(handle, "uuid"))

    def nvmlDeviceGetPciInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(busId=self._get(handle, "bus"))

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        assert sensor == 0
        return int(self._get(handle, "temp"))

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return int(self._get(handle, "power_mw"))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: int) -> int:
        return int(self._get(handle, "limit_mw"))

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        gpu, mem = self._get(handle, "util")
        return SimpleNamespace(gpu=gpu, memory=mem)

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: Any = None) -> SimpleNamespace:
        total, used = self._get(handle, "mem")
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetClockInfo(self, handle: int, type: int) -> int:
        return int(self._get(handle, "clocks")[type])

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: int) -> int:
        return int(self._get(handle, "reasons"))

    def nvmlDeviceGetTotalEccErrors(self, handle: int, errorType: int, counterType: int) -> int:
        ecc = self._get(handle, "ecc")
        if (errorType, counterType) not in ecc:
            raise FakeNvmlError(NO_PERMISSION)
        return int(ecc[(errorType, counterType)])

    def nvmlDeviceGetRemappedRows(self, device: int) -> tuple[int, int, int, int]:
        rows: tuple[int, int, int, int] = self._get(device, "rows")
        return rows

    def nvmlDeviceGetPcieReplayCounter(self, handle: int) -> int:
        return int(self._get(handle, "replay"))

    def nvmlDeviceGetNvLinkState(self, device: int, link: int) -> int:
        links = self._get(device, "links")
        if link >= len(links):
            raise FakeNvmlError(2)  # INVALID_ARGUMENT
        return int(links[link])

    def nvmlDeviceGetNvLinkErrorCounter(self, device: int, link: int, counter: int) -> int:
        raise FakeNvmlError(NOT_SUPPORTED)

    def nvmlDeviceGetFieldValues(self, handle: int, fieldIds: list[int]) -> list[Any]:
        fields = self._gpu(handle)["fields"]
        return [SimpleNamespace(fieldId=f, nvmlReturn=0 if f in fields else NOT_SUPPORTED,
                                valueType=1, value=SimpleNamespace(uiVal=fields.get(f, 0)))
                for f in fieldIds]

    def nvmlEventSetCreate(self) -> str:
        return "event-set"

    def nvmlDeviceRegisterEvents(self, handle: int, eventTypes: int, eventSet: str) -> None:
        assert eventTypes == 0x8 and eventSet == "event-set"
        self.registered.append(handle)

    def nvmlEventSetWait_v2(self, eventSet: str, timeoutms: int) -> SimpleNamespace:
        self.waits.append(timeoutms)
        if not self.events:
            raise FakeNvmlError(TIMEOUT)
        gpu, etype, data = self.events.pop(0)
        return SimpleNamespace(device=gpu, eventType=etype, eventData=data,
                               gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)

    def nvmlEventSetFree(self, eventSet: str) -> None:
        self.log.append("free")


@pytest.fixture
def fake() -> FakeNvml:
    return FakeNvml()


def test_supported_fields_in_payload_units(fake: FakeNvml) -> None:
    reading = NvmlCollector(node="n1", nvml=fake).collect(1_000)
    a100, t4 = reading.gpus
    assert a100.index == 0 and a100.model == "NVIDIA A100-SXM4-80GB"
    assert a100.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert a100.pci_bus_id == "00000000:01:00.0"  # bytes from the ctypes struct, decoded
    assert a100.temperature_c == 27 and a100.memory_temperature_c == 44
    assert a100.power_w == pytest.approx(67.03) and a100.power_limit_w == 500
    assert a100.fb_total_mib == 81920 and a100.fb_used_mib == 50
    assert a100.sm_clock_mhz == 1275 and a100.mem_clock_mhz == 1593
    assert a100.sm_util_pct == 0 and a100.mem_util_pct == 0
    assert a100.throttle_reasons == ["gpu_idle", "sw_power_cap"]
    assert a100.ecc_sbe_aggregate == 3 and a100.ecc_dbe_volatile == 0
    assert (a100.remapped_rows_correctable, a100.remapped_rows_uncorrectable) == (1, 0)
    assert a100.remapped_rows_pending is False and a100.remapped_rows_failure is False
    assert (a100.nvlink_links_up, a100.nvlink_links_total) == (11, 12)
    assert a100.nvlink_crc_errors == 3 and a100.nvlink_replay_errors == 5
    assert a100.nvlink_recovery_errors == 0
    assert a100.recovery_action == "gpu_reset"
    assert t4.temperature_c == 40 and t4.power_w == pytest.approx(26.78)
    assert reading.malformed == {}


def test_not_supported_and_no_permission_give_none(fake: FakeNvml) -> None:
    t4 = NvmlCollector(node="n1", nvml=fake).collect(1).gpus[1]
    assert t4.memory_temperature_c is None  # field value answered NOT_SUPPORTED
    assert t4.throttle_reasons == []  # call raised NOT_SUPPORTED
    assert t4.ecc_sbe_aggregate is None and t4.ecc_dbe_aggregate is None  # NO_PERMISSION
    assert t4.ecc_sbe_volatile == 0
    assert t4.remapped_rows_correctable is None and t4.remapped_rows_failure is None
    assert t4.nvlink_links_up is None and t4.nvlink_links_total is None
    assert t4.nvlink_crc_errors is None
    assert t4.recovery_action is None


def test_xid_event_becomes_node_health_and_sample_xid(fake: FakeNvml) -> None:
    collector = NvmlCollector(node="n1", job_id="job-7", nvml=fake)
    collector.open()
    assert fake.registered == [0, 1] and collector.xid_registered == [0, 1]
    fake.events = [(1, 0x8, 79), (0, 0x2, 0), (0, 0x8, 48)]  # one non-Xid event in between
    reading = collector.collect(5_000_000)
    assert fake.waits and set(fake.waits) == {0}  # never blocks
    assert [g.xids for g in reading.gpus] == [[48], [79]]
    assert len(reading.discrete) == 2
    first = reading.discrete[0]
    assert isinstance(first.payload, NodeHealth)
    assert first.payload.kind is NodeHealthKind.XID and first.payload.code == 79
    assert first.payload.origin == "nvml"
    assert first.payload.device == "0000:00:1e"  # the kernel log's Xid device form
    assert first.subject.gpu == 1 and first.subject.node == "n1"
    assert first.job_id == "job-7" and first.event_time == 5_000_000
    again = collector.collect(6_000_000)
    assert again.discrete == [] and [g.xids for g in again.gpus] == [[], []]


def test_lost_gpu_counted_other_gpu_still_read(fake: FakeNvml) -> None:
    collector = NvmlCollector(node="n1", nvml=fake)
    collector.open()
    fake.lost.add(0)
    reading = collector.collect(1)
    assert reading.malformed.get("nvml_gpu_lost", 0) >= 5
    lost = reading.gpus[0]
    assert lost.temperature_c is None and lost.power_w is None
    assert lost.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"  # identity kept from open
    assert reading.gpus[1].temperature_c == 40


def test_init_failure_never_raises_and_close(fake: FakeNvml) -> None:
    broken = NvmlCollector(node="n1", nvml=FakeNvml(init_error=LIB_NOT_FOUND))
    assert broken.collect(1).malformed == {"nvml_init": 1}
    assert broken.collect(2).malformed == {"nvml_init": 1}
    collector = NvmlCollector(node="n1", nvml=fake)
    collector.collect(1)
    collector.close()
    assert fake.log == ["init", "free", "shutdown"]


# --- the fake speaks pynvml's API ------------------------------------------------------------


def test_fake_matches_real_pynvml_signatures() -> None:
    pynvml = pytest.importorskip("pynvml")
    for name, fn in inspect.getmembers(FakeNvml, inspect.isfunction):
        if not name.startswith("nvml"):
            continue
        real = getattr(pynvml, name)
        want = [p.name for p in inspect.signature(real).parameters.values()]
        got = [p.name for p in inspect.signature(fn).parameters.values()][1:]  # drop self
        assert got == want, name
    for name in ("NVML_TEMPERATURE_GPU", "NVML_CLOCK_SM", "NVML_CLOCK_MEM", "NVML_VOLATILE_ECC",
                 "NVML_AGGREGATE_ECC", "NVML_FEATURE_ENABLED", "nvmlEventTypeXidCriticalError",
                 "NVML_FI_DEV_MEMORY_TEMP", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
                 "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"):
        assert getattr(FakeNvml, name) == getattr(pynvml, name), name


# --- real pynvml wrappers over a fake libnvidia-ml ---------------------------------------------


def _ptr_value(p: Any) -> int:
    return int(ctypes.cast(p, ctypes.c_void_p).value or 0)


def _set_ptr(ref: Any, value: int) -> None:
    ctypes.cast(ctypes.byref(ref._obj), ctypes.POINTER(ctypes.c_void_p)).contents.value = value


class FakeLib:
    """C entry points of libnvidia-ml.so as pynvml calls them (ctypes arguments, byref outs)."""

    def __init__(self, pynvml: Any) -> None:
        self.pynvml = pynvml
        self.events = [(0x1000, 0x8, 94)]
        self.freed = False

    def __getattr__(self, name: str) -> Callable[..., int]:
        raise AttributeError(name)  # -> NVML_ERROR_FUNCTION_NOT_FOUND in pynvml

    @staticmethod
    def _dev(handle: Any) -> int:
        return _ptr_value(handle) - 0x1000

    def nvmlInitWithFlags(self, flags: int) -> int:
        return 0

    def nvmlShutdown(self) -> int:
        return 0

    def nvmlDeviceGetCount_v2(self, count: Any) -> int:
        count._obj.value = 1
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index: Any, dev: Any) -> int:
        _set_ptr(dev, 0x1000 + index.value)
        return 0

    def nvmlDeviceGetIndex(self, dev: Any, index: Any) -> int:
        index._obj.value = self._dev(dev)
        return 0

    def nvmlDeviceGetName(self, dev: Any, buf: Any, size: Any) -> int:
        buf.value = b"NVIDIA H100 80GB HBM3"
        return 0

    def nvmlDeviceGetUUID(self, dev: Any, buf: Any, size: Any) -> int:
        buf.value = b"GPU-00000000-0000-0000-0000-000000000000"
        return 0

    def nvmlDeviceGetPciInfo_v3(self, dev: Any, info: Any) -> int:
        info._obj.busId = b"00000000:00:09.0"
        return 0

    def nvmlDeviceGetTemperature(self, dev: Any, sensor: Any, out: Any) -> int:
        out._obj.value = 59
        return 0

    def nvmlDeviceGetPowerUsage(self, dev: Any, out: Any) -> int:
        out._obj.value = 631950
        return 0

    def nvmlDeviceGetEnforcedPowerLimit(self, dev: Any, out: Any) -> int:
        out._obj.value = 700000
        return 0

    def nvmlDeviceGetUtilizationRates(self, dev: Any, out: Any) -> int:
        out._obj.gpu, out._obj.memory = 100, 11
        return 0

    def nvmlDeviceGetMemoryInfo_v2(self, dev: Any, out: Any) -> int:
        assert out._obj.version == self.pynvml.nvmlMemory_v2
        out._obj.total, out._obj.used = 81559 * MIB, 19818 * MIB
        out._obj.reserved, out._obj.free = 479 * MIB, (81559 - 19818 - 479) * MIB
        return 0

    def nvmlDeviceGetClockInfo(self, dev: Any, clock: Any, out: Any) -> int:
        out._obj.value = {1: 1980, 2: 2619}[clock.value]
        return 0

    def nvmlDeviceGetCurrentClocksEventReasons(self, dev: Any, out: Any) -> int:
        out._obj.value = 0x4
        return 0

    def nvmlDeviceGetTotalEccErrors(self, dev: Any, etype: Any, ctype: Any, out: Any) -> int:
        out._obj.value = 7 if (etype.value, ctype.value) == (0, 1) else 0
        return 0

    def nvmlDeviceGetRemappedRows(self, dev: Any, corr: Any, unc: Any, pend: Any, fail: Any
                                  ) -> int:
        corr._obj.value, unc._obj.value, pend._obj.value, fail._obj.value = 2, 1, 1, 0
        return 0

    def nvmlDeviceGetPcieReplayCounter(self, dev: Any, out: Any) -> int:
        return NOT_SUPPORTED

    def nvmlDeviceGetFieldValues(self, dev: Any, count: Any, values: Any) -> int:
        arr = values._obj
        for i in range(count.value):
            entry = arr[i]
            if entry.fieldId == 82:
                entry.nvmlReturn, entry.valueType, entry.value.uiVal = 0, 1, 54
            elif entry.fieldId == 91:
                entry.nvmlReturn, entry.valueType, entry.value.uiVal = 0, 1, 18
            elif entry.fieldId == 52:
                entry.nvmlReturn, entry.valueType, entry.value.ullVal = 0, 3, 9
            elif entry.fieldId == 230:
                entry.nvmlReturn, entry.valueType, entry.value.uiVal = 0, 1, 0
            else:
                entry.nvmlReturn = NOT_SUPPORTED
        return 0

    def nvmlDeviceGetNvLinkState(self, dev: Any, link: int, out: Any) -> int:
        out._obj.value = 0 if link == 17 else 1
        return 0

    def nvmlDeviceGetNvLinkErrorCounter(self, dev: Any, link: int, counter: int, out: Any
                                        ) -> int:
        out._obj.value = 1 if counter in (2, 3) else 0  # CRC flit + data: 1 each per link
        return 0 if counter != 1 else NOT_SUPPORTED

    def nvmlEventSetCreate(self, es: Any) -> int:
        _set_ptr(es, 0x2000)
        return 0

    def nvmlDeviceRegisterEvents(self, dev: Any, types: Any, es: Any) -> int:
        assert types.value == 0x8 and _ptr_value(es) == 0x2000
        return 0

    def nvmlEventSetWait_v2(self, es: Any, data: Any, timeout: Any) -> int:
        assert timeout.value == 0
        if not self.events:
            return TIMEOUT
        dev, etype, code = self.events.pop(0)
        _set_ptr(SimpleNamespace(_obj=data._obj.device), dev)
        data._obj.eventType, data._obj.eventData = etype, code
        return 0

    def nvmlEventSetFree(self, es: Any) -> int:
        self.freed = True
        return 0


@pytest.fixture
def real_pynvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, FakeLib]]:
    pynvml = pytest.importorskip("pynvml")
    lib = FakeLib(pynvml)
    monkeypatch.setattr(pynvml, "nvmlLib", lib)
    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
    yield pynvml, lib


def test_real_pynvml_wrappers_decode_to_sample(real_pynvml: tuple[Any, FakeLib]) -> None:
    pynvml, lib = real_pynvml
    collector = NvmlCollector(node="n1", nvml=pynvml)
    reading = collector.collect(9)
    (gpu,) = reading.gpus
    assert gpu.model == "NVIDIA H100 80GB HBM3"
    assert gpu.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert gpu.pci_bus_id == "00000000:00:09.0"
    assert gpu.temperature_c == 59 and gpu.memory_temperature_c == 54
    assert gpu.power_w == pytest.approx(631.95) and gpu.power_limit_w == 700
    assert gpu.sm_util_pct == 100 and gpu.mem_util_pct == 11
    assert gpu.fb_used_mib == 19818 and gpu.fb_total_mib == 81559  # v2: reserved not "used"
    assert gpu.sm_clock_mhz == 1980 and gpu.mem_clock_mhz == 2619
    assert gpu.throttle_reasons == ["sw_power_cap"]
    assert gpu.ecc_sbe_aggregate == 7 and gpu.ecc_dbe_volatile == 0
    assert (gpu.remapped_rows_correctable, gpu.remapped_rows_uncorrectable) == (2, 1)
    assert gpu.remapped_rows_pending is True and gpu.remapped_rows_failure is False
    assert gpu.pcie_replay_count is None  # NOT_SUPPORTED from the library
    assert (gpu.nvlink_links_up, gpu.nvlink_links_total) == (17, 18)
    assert gpu.nvlink_replay_errors == 9  # all-lanes field value (ullVal)
    assert gpu.nvlink_crc_errors == 2 * 17  # per-link fallback: flit + data on 17 up links
    assert gpu.nvlink_recovery_errors is None
    assert gpu.recovery_action == "none"
    assert gpu.xids == [94]
    (event,) = reading.discrete
    assert isinstance(event.payload, NodeHealth)
    assert event.payload.code == 94 and event.payload.device == "0000:00:09"
    assert reading.malformed == {}
    collector.close()
    assert lib.freed


# --- the check command -----------------------------------------------------------------------


def test_check_exit_codes(fake: FakeNvml) -> None:
    out = io.StringIO()
    assert check.main(["--samples", "2", "--interval", "0"], nvml=fake, out=out) == 0
    text = out.getvalue()
    assert "GPU 1:" in text and "power_w" in text and "67.03" in text
    assert "NVML check OK" in text
    no_power = FakeNvml([dict(GPUS[0], power_mw=None), GPUS[1]])
    assert check.main(["--samples", "1"], nvml=no_power, out=io.StringIO()) == 1
    assert check.main(["--samples", "1"], nvml=FakeNvml(init_error=LIB_NOT_FOUND),
                      out=io.StringIO()) == 2
    assert check.main(["--samples", "1"], nvml=FakeNvml([]), out=io.StringIO()) == 3


def test_sources_are_collectors(fake: FakeNvml) -> None:
    collectors: list[Collector] = [NvmlCollector(node="n1", nvml=fake),
                                   DcgmExporterCollector("http://127.0.0.1:1/metrics"),
                                   NvidiaSmiCollector(binary="/nonexistent/nvidia-smi")]
    assert [c.name for c in collectors] == ["nvml", "dcgm", "nvidia_smi"]
