"""nvidia-smi recordings: ``-q -x`` XML and ``--query-gpu`` CSV parse to the recorded values;
the H100 capture agrees with what nvidia_gpu_exporter derived from it; the fallback source."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trainguard.collectors.gpu.smi_parse import parse_smi_csv, parse_smi_xml, smi_number
from trainguard.collectors.gpu.smi_source import NvidiaSmiCollector

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "gpu"
H100_CAPTURE = "nvidia_gpu_exporter_linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.capture.txt"
H200_CAPTURE = "nvidia_gpu_exporter_linux-x86_64__nvidia-h200-mig__590.48.01.capture.txt"
MIB = 1024 * 1024


def _text(name: str) -> str:
    return (FIX / name).read_text()


def capture_section(text: str, title: str) -> str:
    """The body of one ``# <phase> :: <what>`` section of an nvidia_gpu_exporter capture."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith(f"# {title}"))
    i = start
    while not lines[i + 1].startswith("####"):
        i += 1
    body = []
    for ln in lines[i + 2:]:
        if ln.startswith("####"):
            break
        body.append(ln)
    return "\n".join(body)


def _expected_metrics() -> dict[str, float]:
    out = {}
    text = _text("nvidia_gpu_exporter_h100__load.expected.metrics")
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if set(s.labels) == {"uuid"}:
                out[s.name] = s.value
    return out


# --- -q -x -----------------------------------------------------------------------------------


def test_a100_xml_recorded_values() -> None:
    result = parse_smi_xml(_text("telegraf_a100-sxm4-v12.xml"))
    assert result.malformed == {}
    (gpu,) = result.gpus
    assert gpu.index == 0
    assert gpu.model == "NVIDIA A100-SXM4-80GB"
    assert gpu.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert gpu.pci_bus_id == "00000000:01:00.0"
    assert gpu.power_w == pytest.approx(67.03)
    assert gpu.power_limit_w == 500
    assert gpu.temperature_c == 27
    assert gpu.memory_temperature_c == 44
    assert gpu.fb_total_mib == 81920
    assert gpu.fb_used_mib == 50
    assert gpu.sm_clock_mhz == 1275 and gpu.mem_clock_mhz == 1593
    assert gpu.sm_util_pct is None and gpu.mem_util_pct is None  # N/A with MIG on
    assert gpu.ecc_sbe_volatile == 0 and gpu.ecc_dbe_aggregate == 0
    assert gpu.remapped_rows_correctable is None  # <remapped_rows>N/A</remapped_rows>
    assert gpu.pcie_replay_count == 0
    assert gpu.throttle_reasons == []


def test_t4_xml_older_dtd() -> None:
    (gpu,) = parse_smi_xml(_text("telegraf_tesla-t4.xml")).gpus
    assert gpu.model == "Tesla T4"
    assert gpu.uuid == "GPU-d37e67a5-91dd-3774-a5cb-99096249601a"
    assert gpu.power_w == pytest.approx(26.78)  # <power_readings>, DTD v11
    assert gpu.power_limit_w == 70
    assert gpu.temperature_c == 40
    assert gpu.memory_temperature_c is None
    assert gpu.fb_total_mib == 15360 and gpu.fb_used_mib == 1032
    assert gpu.sm_util_pct == 0 and gpu.mem_util_pct == 0
    assert gpu.sm_clock_mhz == 585 and gpu.mem_clock_mhz == 5000


def test_xml_active_throttle_and_bad_xml() -> None:
    tag = "<clocks_throttle_reason_sw_power_cap>"
    text = _text("telegraf_tesla-t4.xml").replace(f"{tag}Not Active", f"{tag}Active")
    assert parse_smi_xml(text).gpus[0].throttle_reasons == ["sw_power_cap"]
    assert parse_smi_xml("<nvidia_smi_log><gpu>").malformed == {"smi_xml": 1}


# --- --query-gpu CSV -------------------------------------------------------------------------


def test_h100_load_csv_matches_exporter_expected_metrics() -> None:
    csv_text = capture_section(_text(H100_CAPTURE), "load :: query-gpu (csv")
    result = parse_smi_csv(csv_text)
    assert result.malformed == {}
    (gpu,) = result.gpus
    exp = _expected_metrics()
    assert gpu.model == "NVIDIA H100 80GB HBM3"
    assert gpu.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert gpu.index == exp["nvidia_smi_index"] == 0
    assert gpu.temperature_c == exp["nvidia_smi_temperature_gpu"] == 59
    assert gpu.memory_temperature_c == exp["nvidia_smi_temperature_memory"] == 54
    assert gpu.power_w == pytest.approx(exp["nvidia_smi_power_draw_watts"]) == 631.95
    assert gpu.power_limit_w == exp["nvidia_smi_enforced_power_limit_watts"] == 700
    assert gpu.sm_util_pct == pytest.approx(100 * exp["nvidia_smi_utilization_gpu_ratio"])
    assert gpu.mem_util_pct == pytest.approx(100 * exp["nvidia_smi_utilization_memory_ratio"])
    assert gpu.fb_total_mib == exp["nvidia_smi_memory_total_bytes"] / MIB == 81559
    assert gpu.fb_used_mib == exp["nvidia_smi_memory_used_bytes"] / MIB == 19818
    assert gpu.sm_clock_mhz == exp["nvidia_smi_clocks_current_sm_clock_hz"] / 1e6 == 1980
    assert gpu.mem_clock_mhz == exp["nvidia_smi_clocks_current_memory_clock_hz"] / 1e6
    assert exp["nvidia_smi_clocks_event_reasons_active"] == 0 and gpu.throttle_reasons == []
    assert gpu.ecc_sbe_volatile == exp["nvidia_smi_ecc_errors_corrected_volatile_total"] == 0
    assert gpu.ecc_dbe_aggregate == exp["nvidia_smi_ecc_errors_uncorrected_aggregate_total"]
    assert gpu.remapped_rows_correctable == exp["nvidia_smi_remapped_rows_correctable"] == 0
    assert gpu.remapped_rows_failure is (exp["nvidia_smi_remapped_rows_failure"] != 0)
    assert gpu.recovery_action == "none" and exp["nvidia_smi_gpu_recovery_action"] == 0


def test_h100_idle_csv_gpu_idle_throttle() -> None:
    (gpu,) = parse_smi_csv(capture_section(_text(H100_CAPTURE), "idle :: query-gpu (csv")).gpus
    assert gpu.throttle_reasons == ["gpu_idle"]  # clocks_event_reasons.active 0x...01
    assert gpu.temperature_c == 41 and gpu.power_w == pytest.approx(69.85)
    assert gpu.sm_clock_mhz == 345


def test_h200_mig_csv_na_utilisation() -> None:
    (gpu,) = parse_smi_csv(capture_section(_text(H200_CAPTURE), "load :: query-gpu (csv")).gpus
    assert gpu.model == "NVIDIA H200"
    assert gpu.sm_util_pct is None and gpu.mem_util_pct is None  # [N/A] under MIG
    assert gpu.fb_total_mib == 143771 and gpu.fb_used_mib == 16959
    assert gpu.temperature_c == 36 and gpu.power_w == pytest.approx(295.01)


def test_csv_noheader_nounits_and_bad_rows() -> None:
    cols = ["index", "uuid", "temperature.gpu", "power.draw", "memory.used", "memory.total",
            "clocks_throttle_reasons.active"]
    text = "0, GPU-a, 45, 250.50, 1000, 40960, 0x0000000000000044\n1, GPU-b, [N/A]\n"
    result = parse_smi_csv(text, columns=cols)
    assert result.malformed == {"smi_csv_row": 1}
    (gpu,) = result.gpus
    assert (gpu.index, gpu.uuid, gpu.temperature_c, gpu.power_w) == (0, "GPU-a", 45, 250.5)
    assert gpu.throttle_reasons == ["sw_power_cap", "hw_thermal_slowdown"]
    assert smi_number("[Requested functionality has been deprecated]") is None


# --- the nvidia-smi source -------------------------------------------------------------------


def test_smi_source_runs_query_and_falls_back_on_old_driver() -> None:
    calls: list[list[str]] = []
    csv_text = capture_section(_text(H100_CAPTURE), "load :: query-gpu (csv")

    def runner(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        calls.append(list(argv))
        if "clocks_event_reasons.active" in argv[1]:
            err = 'Field "clocks_event_reasons.active" is not a valid field to query.'
            return subprocess.CompletedProcess(argv, 2, "", err)
        return subprocess.CompletedProcess(argv, 0, csv_text, "")

    collector = NvidiaSmiCollector(runner=runner)
    reading = collector.collect(1)
    assert len(calls) == 2 and "clocks_throttle_reasons.active" in calls[1][1]
    assert calls[1][2] == "--format=csv,nounits"
    assert reading.gpus[0].power_w == pytest.approx(631.95)


def test_smi_source_missing_binary_counts() -> None:
    collector = NvidiaSmiCollector(binary="/nonexistent/nvidia-smi")
    assert not collector.available()
    reading = collector.collect(1)
    assert reading.malformed == {"nvidia_smi_missing": 1} and reading.gpus == []
