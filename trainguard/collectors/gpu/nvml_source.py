"""The NVML source: per-GPU samples through nvidia-ml-py, plus Xid events from an event set.

``open()`` initialises NVML, takes a handle per GPU and registers every GPU for
``nvmlEventTypeXidCriticalError`` on one event set. Each ``collect()`` drains that set with
``nvmlEventSetWait_v2(set, 0)`` (never blocks: NVML answers ``NVML_ERROR_TIMEOUT`` when it is
empty), turns each Xid into a ``NodeHealth(kind=xid, origin="nvml")`` discrete event and into
``GpuSample.xids`` of its GPU, then reads every GPU. ``collect()`` never raises: NVML that
cannot start counts ``nvml_init`` (logged once) and gives an empty reading.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any

from trainguard.collectors.base import Discrete, Reading
from trainguard.collectors.gpu.names import kernel_pci
from trainguard.collectors.gpu.nvml_calls import (
    NVML_ERROR_TIMEOUT,
    NvmlCalls,
    is_quiet,
    to_int,
)
from trainguard.collectors.gpu.nvml_device import identity, read_device
from trainguard.collectors.gpu.sample import MalformedLog, build_sample
from trainguard.events.envelope import Subject
from trainguard.events.payloads import NodeHealth, NodeHealthKind

log = logging.getLogger(__name__)

XID_CRITICAL_ERROR = 0x0000000000000008  # nvmlEventTypeXidCriticalError
MAX_EVENTS_PER_COLLECT = 4096


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here: binding not installed, library or driver missing, no GPU."""


def load_pynvml() -> Any:
    """The ``pynvml`` module of nvidia-ml-py, or ``NvmlUnavailable``."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise NvmlUnavailable(f"nvidia-ml-py (pynvml) is not installed: {exc}") from exc


class NvmlCollector:
    """GPUs of this node through NVML.

    ``node``: node name for subjects; ``job_id``: for discrete events (default
    ``node:<node>``); ``nvml``: the pynvml module or a stand-in (default: import pynvml);
    ``watch_xids``: register the Xid event set.
    """

    name = "nvml"

    def __init__(self, *, node: str, job_id: str | None = None, nvml: Any | None = None,
                 watch_xids: bool = True) -> None:
        self.node = node
        self.job_id = job_id or f"node:{node}"
        self._nvml = nvml
        self.watch_xids = watch_xids
        self.calls: NvmlCalls | None = None
        self.handles: list[Any] = []
        self.idents: list[dict[str, Any]] = []
        self.event_set: Any = None
        self.xid_registered: list[int] = []  # GPU indices whose Xids the event set watches
        self._bad = MalformedLog(log, "nvml")

    # --- lifecycle ---------------------------------------------------------------------

    def open(self) -> None:
        """Initialise NVML and enumerate GPUs; raises ``NvmlUnavailable`` with the reason."""
        if self.calls is not None:
            return
        nv = self._nvml if self._nvml is not None else load_pynvml()
        calls = NvmlCalls(nv)
        try:
            nv.nvmlInit()
        except Exception as exc:
            raise NvmlUnavailable(f"NVML init failed: {exc}") from exc
        try:
            count = int(nv.nvmlDeviceGetCount())
        except Exception as exc:
            calls.call("nvmlShutdown")
            raise NvmlUnavailable(f"NVML cannot count GPUs: {exc}") from exc
        self.handles, self.idents = [], []
        for i in range(count):
            handle = calls.call("nvmlDeviceGetHandleByIndex", i)
            self.handles.append(handle)
            self.idents.append(identity(calls, handle) if handle is not None else {})
        self.calls = calls
        if self.watch_xids:
            self._register_xids(calls)

    def _register_xids(self, calls: NvmlCalls) -> None:
        es = calls.call("nvmlEventSetCreate")
        if es is None:
            return
        xid = calls.const("nvmlEventTypeXidCriticalError", XID_CRITICAL_ERROR)
        for i, handle in enumerate(self.handles):
            if handle is None:
                continue
            fn = getattr(calls.nvml, "nvmlDeviceRegisterEvents", None)
            try:
                if fn is not None:
                    fn(handle, xid, es)
                    self.xid_registered.append(i)
            except Exception as exc:
                if calls.error_code(exc) is None:
                    raise
                log.info("nvml: GPU %d cannot report Xid events: %s", i, exc)
        self.event_set = es

    def close(self) -> None:
        calls = self.calls
        if calls is None:
            return
        if self.event_set is not None:
            calls.call("nvmlEventSetFree", self.event_set)
        calls.call("nvmlShutdown")
        self.calls, self.event_set, self.handles, self.xid_registered = None, None, [], []

    # --- reading -----------------------------------------------------------------------

    def collect(self, now_us: int) -> Reading:
        reading = Reading()
        try:
            self.open()
        except Exception as exc:  # NvmlUnavailable, or a broken binding
            self._bad.count(reading.malformed, "nvml_init", str(exc))
            return reading
        calls = self.calls
        assert calls is not None
        calls.errors = {}
        xids = self._drain_xids(calls, now_us, reading)
        for i, handle in enumerate(self.handles):
            if handle is None:
                self._bad.count(reading.malformed, "nvml_no_handle", f"GPU {i}")
                continue
            try:
                fields = read_device(calls, handle, i, self.idents[i])
            except Exception as exc:  # a binding bug must not stop the agent
                self._bad.count(reading.malformed, "nvml_unexpected", repr(exc))
                continue
            fields["xids"] = xids.get(i, [])
            sample = build_sample(fields, reading.malformed, "nvml")
            if sample is not None:
                reading.gpus.append(sample)
        for kind, n in calls.errors.items():
            self._bad.count(reading.malformed, kind, "NVML call failed", n)
        return reading

    def _drain_xids(self, calls: NvmlCalls, now_us: int, reading: Reading) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        if self.event_set is None:
            return out
        xid_type = calls.const("nvmlEventTypeXidCriticalError", XID_CRITICAL_ERROR)
        wait = getattr(calls.nvml, "nvmlEventSetWait_v2", None) or getattr(
            calls.nvml, "nvmlEventSetWait", None)
        if wait is None:
            return out
        for _ in range(MAX_EVENTS_PER_COLLECT):
            try:
                data = wait(self.event_set, 0)
            except Exception as exc:
                code = calls.error_code(exc)
                if code is None:
                    self._bad.count(reading.malformed, "nvml_unexpected", repr(exc))
                elif code != NVML_ERROR_TIMEOUT and not is_quiet(code):
                    self._bad.count(reading.malformed, f"nvml_event_error_{code}", str(exc))
                break
            etype = to_int(getattr(data, "eventType", None)) or 0
            code_val = to_int(getattr(data, "eventData", None))
            if not etype & xid_type or code_val is None or code_val < 0:
                continue
            index = self._index_of(calls, getattr(data, "device", None))
            if index is not None:
                out.setdefault(index, []).append(code_val)
            reading.discrete.append(self._xid_event(index, code_val, now_us))
        return out

    def _index_of(self, calls: NvmlCalls, device: Any) -> int | None:
        if device is None:
            return None
        idx = to_int(calls.call("nvmlDeviceGetIndex", device))
        if idx is not None and 0 <= idx < len(self.handles):
            return idx
        uuid = identity(calls, device).get("uuid")
        for i, ident in enumerate(self.idents):
            if uuid is not None and ident.get("uuid") == uuid:
                return i
        return None

    def _xid_event(self, index: int | None, code: int, now_us: int) -> Discrete:
        ident = self.idents[index] if index is not None else {}
        pci = ident.get("pci_bus_id")
        device = kernel_pci(pci) if isinstance(pci, str) else (
            str(index) if index is not None else None)
        where = "?" if index is None else str(index)
        payload = NodeHealth(kind=NodeHealthKind.XID, code=code, device=device,
                             origin="nvml", message=f"NVML Xid {code} on GPU {where}")
        return Discrete(payload=payload, job_id=self.job_id, event_time=now_us,
                        subject=Subject(node=self.node, gpu=index))

