"""The fallback source: run ``nvidia-smi --query-gpu=... --format=csv,nounits`` and parse it.

For nodes where neither NVML (through nvidia-ml-py) nor a dcgm-exporter is usable. Older
drivers refuse the whole query when one field name is unknown to them; then the older field
list is used from that point on. Never raises: a missing binary, a timeout or a failing run
counts ``nvidia_smi_missing`` / ``nvidia_smi_timeout`` / ``nvidia_smi_failed``.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable, Sequence

from trainguard.collectors.base import Reading
from trainguard.collectors.gpu.sample import MalformedLog
from trainguard.collectors.gpu.smi_parse import QUERY_FIELDS, QUERY_FIELDS_OLD, parse_smi_csv

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]


def run_command(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                          check=False)


class NvidiaSmiCollector:
    """``binary``: nvidia-smi name or path; ``timeout_s``: per run; ``runner``: for tests."""

    name = "nvidia_smi"

    def __init__(self, *, binary: str = "nvidia-smi", timeout_s: float = 10.0,
                 runner: Runner | None = None) -> None:
        self.binary = binary
        self.timeout_s = timeout_s
        self.runner = runner or run_command
        self.fields: tuple[str, ...] = QUERY_FIELDS
        self._bad = MalformedLog(log, "nvidia-smi")

    def available(self) -> bool:
        return shutil.which(self.binary) is not None

    def argv(self) -> list[str]:
        return [self.binary, "--query-gpu=" + ",".join(self.fields), "--format=csv,nounits"]

    def collect(self, now_us: int) -> Reading:
        reading = Reading()
        for _ in range(2):
            try:
                proc = self.runner(self.argv(), self.timeout_s)
            except FileNotFoundError as exc:
                self._bad.count(reading.malformed, "nvidia_smi_missing", str(exc))
                return reading
            except subprocess.TimeoutExpired as exc:
                self._bad.count(reading.malformed, "nvidia_smi_timeout", str(exc))
                return reading
            except OSError as exc:
                self._bad.count(reading.malformed, "nvidia_smi_failed", str(exc))
                return reading
            if proc.returncode == 0:
                return self.parse(proc.stdout, reading)
            text = f"{proc.stdout}\n{proc.stderr}"
            if "not a valid field" in text and self.fields != QUERY_FIELDS_OLD:
                log.info("nvidia-smi: older driver, using the older query field list")
                self.fields = QUERY_FIELDS_OLD
                continue
            self._bad.count(reading.malformed, "nvidia_smi_failed",
                            f"rc={proc.returncode}: {text.strip()}")
            return reading
        return reading

    def parse(self, text: str, reading: Reading | None = None) -> Reading:
        reading = reading if reading is not None else Reading()
        result = parse_smi_csv(text)
        reading.gpus.extend(result.gpus)
        for kind, n in result.malformed.items():
            self._bad.count(reading.malformed, kind, "nvidia-smi output", n)
        return reading
