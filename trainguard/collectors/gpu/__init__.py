"""GPU telemetry: NVML (nvidia-ml-py), a dcgm-exporter scrape, or nvidia-smi as a fallback.

Each source is a ``Collector`` giving ``GpuSample`` per GPU (and, from NVML, Xid events as
``NodeHealth`` discrete events). Parsing is pure and lives apart from I/O:
``dcgm_parse`` / ``smi_parse`` take text; ``nvml_device`` takes an NVML binding object.
"""

from trainguard.collectors.gpu.dcgm_parse import (
    DcgmScrape,
    DcgmSeries,
    parse_dcgm_text,
    to_gpu_samples,
)
from trainguard.collectors.gpu.dcgm_source import DcgmExporterCollector
from trainguard.collectors.gpu.nvml_source import NvmlCollector, NvmlUnavailable, load_pynvml
from trainguard.collectors.gpu.smi_parse import SmiParse, parse_smi_csv, parse_smi_xml
from trainguard.collectors.gpu.smi_source import NvidiaSmiCollector

__all__ = [
    "DcgmExporterCollector",
    "DcgmScrape",
    "DcgmSeries",
    "NvidiaSmiCollector",
    "NvmlCollector",
    "NvmlUnavailable",
    "SmiParse",
    "load_pynvml",
    "parse_dcgm_text",
    "parse_smi_csv",
    "parse_smi_xml",
    "to_gpu_samples",
]
