"""Calling NVML so that one unsupported query costs one field, never the sample.

``nvml`` is the ``pynvml`` module (nvidia-ml-py) or anything shaped like it (a test fake): the
functions used below, ``NVMLError`` (with ``.value``, the NVML return code) and the constants.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Return codes that mean "this GPU / driver / user cannot answer this": the field is None.
_QUIET = {
    2,  # INVALID_ARGUMENT (e.g. a link index past the device's links)
    3,  # NOT_SUPPORTED
    4,  # NO_PERMISSION
    6,  # NOT_FOUND
    13,  # FUNCTION_NOT_FOUND (older driver)
    21,  # NO_DATA
    25,  # ARGUMENT_VERSION_MISMATCH (a versioned struct the driver predates)
    26,  # DEPRECATED
}
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_TIMEOUT = 10
NVML_SUCCESS = 0


def is_quiet(code: int) -> bool:
    """A return code that only says "cannot answer this here" (not supported, no permission)."""
    return code in _QUIET


class NvmlCalls:
    """Safe calls on one NVML binding; failures go to ``errors`` by kind."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.errors: dict[str, int] = {}

    def const(self, name: str, default: int) -> int:
        value = getattr(self.nvml, name, default)
        return value if isinstance(value, int) else default

    def error_code(self, exc: BaseException) -> int | None:
        err_cls = getattr(self.nvml, "NVMLError", None)
        if isinstance(err_cls, type) and isinstance(exc, err_cls):
            code = getattr(exc, "value", None)
            return code if isinstance(code, int) else -1
        return None

    def call(self, fn_name: str, *args: Any, **kwargs: Any) -> Any:
        """``nvml.<fn_name>(*args)``, or None when it is missing or raises an NVML error."""
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            code = self.error_code(exc)
            if code is None:
                raise
            if not is_quiet(code):
                kind = "nvml_gpu_lost" if code == NVML_ERROR_GPU_IS_LOST else f"nvml_error_{code}"
                self.errors[kind] = self.errors.get(kind, 0) + 1
            return None

    def first(self, names: Sequence[str], *args: Any) -> Any:
        """The first of several equivalent functions (new name, old name) that answers."""
        for name in names:
            if getattr(self.nvml, name, None) is not None:
                return self.call(name, *args)
        return None


def to_str(value: Any) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value.strip("\x00 ").strip() or None
    return None


def to_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def to_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    return None


# c_nvmlFieldValue_t.valueType -> member of the value union (NVML_VALUE_TYPE_*).
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal",
                 6: "usVal"}


def field_values(calls: NvmlCalls, handle: Any, field_ids: Sequence[int]) -> dict[int, float]:
    """``nvmlDeviceGetFieldValues`` -> {field id: value} for the fields that answered.

    Each entry carries its own return code, so one unknown field (an older driver) leaves the
    rest. If the batch call itself fails, every field is asked alone.
    """
    out: dict[int, float] = {}
    if not field_ids:
        return out
    values = calls.call("nvmlDeviceGetFieldValues", handle, list(field_ids))
    if values is None:
        if len(field_ids) > 1:
            for fid in field_ids:
                out.update(field_values(calls, handle, [fid]))
        return out
    for fid, entry in zip(field_ids, values, strict=False):
        ret = getattr(entry, "nvmlReturn", None)
        if ret != NVML_SUCCESS:
            continue
        member = _VALUE_MEMBER.get(getattr(entry, "valueType", -1))
        union = getattr(entry, "value", None)
        raw = getattr(union, member, None) if member is not None else None
        num = to_float(raw)
        if num is not None:
            out[int(getattr(entry, "fieldId", fid))] = num
    return out
