"""dcgm-exporter scrapes: recorded scrapes parse to the recorded values, with their labels and
kinds; blanks and bad lines are counted, never raised; a real HTTP scrape; garbage text."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.collectors.gpu.blanks import (
    DCGM_FP64_BLANK,
    DCGM_INT32_BLANK,
    DCGM_INT64_BLANK,
    is_dcgm_blank,
)
from trainguard.collectors.gpu.dcgm_parse import DCGM_KINDS, parse_dcgm_text, to_gpu_samples
from trainguard.collectors.gpu.dcgm_source import DcgmExporterCollector

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "gpu"
H100 = "aicr_eks_8xH100_metrics.prom"
T4 = "ericsson_T4_metrics.prom"
L4 = "kops_L4_metrics.prom"
L40S = "upcloud_L40S_metrics.prom"
H100_UUIDS = [
    "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005", "GPU-bc5610b9-79c8-fedd-8899-07539c7f868a",
    "GPU-fbc2c554-4d37-8938-0032-f923bad0f716", "GPU-a65a773d-52bb-bcc1-a8ee-f78c3faa2e2d",
    "GPU-82e45d1b-1618-559f-144c-eab51545030b", "GPU-39e28159-8c62-ee71-64db-b748edd61e15",
    "GPU-e64d69ca-b4b3-59b2-e78c-94f26c4db365", "GPU-04d228d3-3b5a-3534-f5cf-969706647d56",
]


def _text(name: str) -> str:
    return (FIX / name).read_text()


def _data_lines(name: str) -> list[str]:
    return [ln for ln in _text(name).splitlines() if ln.strip() and not ln.startswith("#")]


# --- recorded scrapes ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "model", "host"), [
    (H100, "NVIDIA H100 80GB HBM3", "gpu-node-1"),
    (T4, "Tesla T4", "cp-bm14r7"),
    (L4, "NVIDIA L4", "i-030791dc5a37cd257"),
    (L40S, "NVIDIA L40S", None),
])
def test_every_series_keeps_gpu_uuid_model_and_host(name: str, model: str, host: str | None
                                                    ) -> None:
    scrape = parse_dcgm_text(_text(name))
    assert scrape.malformed == {}
    assert len(scrape.series) == len(_data_lines(name))  # every recorded line, none lost
    for s in scrape.series:
        assert s.name.startswith("DCGM_FI_")
        assert s.model == model
        assert s.uuid is not None and s.uuid.startswith("GPU-")
        assert s.hostname is not None
        if host is not None:
            assert s.hostname == host
        assert s.labels["gpu"] == str(s.gpu)


def test_h100_eight_gpus_values_and_uuids() -> None:
    scrape = parse_dcgm_text(_text(H100))
    assert sorted({s.gpu for s in scrape.series}) == list(range(8))
    assert {s.gpu: s.uuid for s in scrape.series} == dict(enumerate(H100_UUIDS))
    gpus = to_gpu_samples(scrape)
    assert [g.index for g in gpus] == list(range(8))
    assert [g.temperature_c for g in gpus] == [30, 29, 26, 29, 28, 26, 28, 26]
    assert gpus[0].power_w == pytest.approx(113.611)
    assert gpus[7].power_w == pytest.approx(66.997)
    assert gpus[5].pci_bus_id == "00000000:A8:00.0"
    assert all(g.sm_util_pct == 0 for g in gpus)
    # the recording is cut off: GPUs 6 and 7 have no MEM_COPY_UTIL line
    assert [g.mem_util_pct for g in gpus] == [0, 0, 0, 0, 0, 0, None, None]
    # an extra pod label on GPU 0 stays on the series
    gpu0_temp = next(s for s in scrape.series if s.gpu == 0 and s.name == "DCGM_FI_DEV_GPU_TEMP")
    assert gpu0_temp.labels["pod"] == "vllm-agg-0-vllmdecodeworker-s65j5"


def test_t4_under_load_maps_every_field() -> None:
    (gpu,) = to_gpu_samples(parse_dcgm_text(_text(T4)))
    assert gpu.model == "Tesla T4"
    assert gpu.uuid == "GPU-6d5c0ac5-74d7-3130-46f1-e93ed57f469a"
    assert gpu.pci_bus_id == "00000000:37:00.0"
    assert gpu.temperature_c == 74
    assert gpu.power_w == pytest.approx(68.244)
    assert gpu.sm_util_pct == 91
    assert gpu.mem_util_pct == 73
    assert gpu.fb_used_mib == 5120
    assert gpu.fb_total_mib == 9791 + 5120 + 447  # free + used + reserved
    assert gpu.sm_clock_mhz == 660
    assert gpu.mem_clock_mhz == 5000
    assert gpu.pcie_replay_count == 0
    assert gpu.memory_temperature_c is None  # GDDR6 board: DCGM prints 0, no sensor
    assert gpu.xids == []


def test_l4_remapped_rows_and_framebuffer() -> None:
    (gpu,) = to_gpu_samples(parse_dcgm_text(_text(L4)))
    assert gpu.temperature_c == 31
    assert gpu.power_w == pytest.approx(16.365)
    assert gpu.fb_used_mib == 0
    assert gpu.fb_total_mib == 22563 + 0 + 470
    assert gpu.remapped_rows_correctable == 0
    assert gpu.remapped_rows_uncorrectable == 0
    assert gpu.remapped_rows_failure is False
    assert gpu.sm_clock_mhz == 210 and gpu.mem_clock_mhz == 405


def test_counters_and_gauges_kept_apart_with_and_without_type_lines() -> None:
    expected_counters = {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"}
    typed = parse_dcgm_text(_text(L4))  # has # TYPE lines
    assert {s.name for s in typed.counters} == expected_counters | {
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"}
    assert "DCGM_FI_DEV_GPU_TEMP" in {s.name for s in typed.gauges}
    assert "DCGM_FI_DEV_ROW_REMAP_FAILURE" in {s.name for s in typed.gauges}
    # PROF_PCIE_*_BYTES: counter in default-counters.csv (commented out) but the exporter's
    # own TYPE line says gauge: the TYPE line wins
    assert "DCGM_FI_PROF_PCIE_TX_BYTES" in {s.name for s in typed.gauges}
    untyped = parse_dcgm_text(_text(T4))  # no # TYPE lines: the exporter's CSV kinds
    assert {s.name for s in untyped.counters} == expected_counters
    assert len(untyped.gauges) == len(untyped.series) - 2
    energy = next(s for s in untyped.counters if s.name.endswith("ENERGY_CONSUMPTION"))
    assert energy.value == 15152422938


def test_kinds_table_agrees_with_dcgm_exporter_csvs() -> None:
    for csv_name in ("dcgm-exporter_default-counters.csv",
                     "dcgm-exporter_dcp-metrics-included.csv"):
        for raw in _text(csv_name).splitlines():
            line = raw.lstrip("# ").strip()
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 3 or not parts[0].startswith("DCGM_") or parts[1] == "label":
                continue
            if parts[0].startswith("DCGM_FI_PROF_PCIE_") and parts[1] == "counter":
                continue  # listed both ways; exporters print gauge (see test above)
            assert DCGM_KINDS.get(parts[0]) == parts[1], parts[0]


# --- blanks and malformed input --------------------------------------------------------------


def _with_value(line: str, value: str) -> str:
    return line.rsplit(" ", 1)[0] + " " + value


@pytest.mark.parametrize("blank", [
    "9223372036854775794", str(DCGM_INT64_BLANK), "9223372036854775807",
    str(DCGM_INT32_BLANK), str(DCGM_INT32_BLANK + 2), "140737488355328", "140737488355330.000000",
])
def test_dcgm_blank_sentinel_rejected_and_counted(blank: str) -> None:
    lines = _data_lines(T4)
    temp = next(i for i, ln in enumerate(lines) if ln.startswith("DCGM_FI_DEV_GPU_TEMP{"))
    lines[temp] = _with_value(lines[temp], blank)
    reading = DcgmExporterCollector("http://unused").parse("\n".join(lines) + "\n")
    assert reading.malformed == {"dcgm_blank": 1}
    (gpu,) = reading.gpus
    assert gpu.temperature_c is None
    assert gpu.power_w == pytest.approx(68.244)  # the rest of the sample stays


def test_blank_predicate_bounds() -> None:
    assert is_dcgm_blank(float(DCGM_INT64_BLANK))
    assert is_dcgm_blank(DCGM_FP64_BLANK + 3.0)
    assert is_dcgm_blank(DCGM_INT32_BLANK)
    assert not is_dcgm_blank(DCGM_INT32_BLANK - 1)
    assert not is_dcgm_blank(DCGM_FP64_BLANK + 16)
    assert not is_dcgm_blank(15152422938)  # a real energy counter
    assert is_dcgm_blank(1.4e308)  # not DCGM's fp64 blank (that is 2**47), but >= int64 blank
    assert not is_dcgm_blank(9.2e18)  # below the int64 blank
    assert not is_dcgm_blank(float("nan"))


def test_malformed_lines_counted_logged_once_and_rest_kept(caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    lines = _data_lines(T4)
    garbage = ['DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="x" 5', "}}}{{{", "DCGM_FI_DEV_SM_CLOCK{} abc",
               'DCGM_FI_DEV_FB_USED{UUID="GPU-1"} 12', "# TYPE DCGM_FI_DEV_X",
               'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 250']
    collector = DcgmExporterCollector("http://unused")
    with caplog.at_level(logging.WARNING):
        reading = collector.parse("\n".join(garbage + lines) + "\n")
        again = collector.parse("\n".join(garbage + lines) + "\n")
    assert reading.malformed == {"prom_line": 3, "dcgm_no_gpu_label": 1, "prom_comment": 1,
                                 "dcgm_duplicate": 1, "dcgm_out_of_range": 1}
    assert again.malformed == reading.malformed
    warned = [r for r in caplog.records if "malformed" in r.getMessage()]
    assert len(warned) == 5  # one per kind, not per line or per scrape
    (gpu,) = reading.gpus
    # GPU_UTIL 250 came first, was kept over the recorded 91 and then refused by the payload
    assert gpu.sm_util_pct is None
    assert gpu.temperature_c == 74 and gpu.mem_clock_mhz == 5000


def test_xid_and_throttle_and_ecc_series() -> None:
    base = 'gpu="1",UUID="GPU-a",modelName="NVIDIA A100-SXM4-80GB",Hostname="n1"'
    text = "\n".join([
        "# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
        f"DCGM_FI_DEV_XID_ERRORS{{{base}}} 79",
        f"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS{{{base}}} 68",
        "# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter",
        f"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{base}}} 2",
        f"DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{{{base}}} 17",
        f"DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{base}}} 3",
        f"DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{{{base}}} 4",
        f"DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{{{base}}} 1",
        f'DCGM_EXP_XID_ERRORS_COUNT{{{base},xid="48"}} 1',
        f'DCGM_EXP_XID_ERRORS_COUNT{{{base},xid="13"}} 0',
    ]) + "\n"
    scrape = parse_dcgm_text(text)
    kinds = {s.name: s.kind for s in scrape.series}
    assert kinds["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == "counter"
    assert kinds["DCGM_FI_DEV_XID_ERRORS"] == "gauge"
    (gpu,) = to_gpu_samples(scrape)
    assert gpu.index == 1 and gpu.uuid == "GPU-a"
    assert gpu.xids == [79, 48]
    assert gpu.throttle_reasons == ["sw_power_cap", "hw_thermal_slowdown"]  # 0x4 | 0x40
    assert gpu.ecc_dbe_volatile == 2 and gpu.ecc_sbe_aggregate == 17
    assert gpu.nvlink_crc_errors == 7 and gpu.nvlink_recovery_errors == 1
    assert gpu.nvlink_replay_errors is None


# --- a real HTTP scrape ----------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    body = b""
    status = 200

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(self.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[HTTPServer]:
    srv = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join(5)


def test_scrape_over_http(server: HTTPServer) -> None:
    _Handler.body = _text(H100).encode()
    port = server.server_address[1]
    reading = DcgmExporterCollector(f"http://127.0.0.1:{port}/metrics", timeout_s=5).collect(1)
    assert reading.malformed == {}
    assert [g.uuid for g in reading.gpus] == H100_UUIDS
    assert reading.gpus[3].temperature_c == 29
    assert reading.gpus[3].power_w == pytest.approx(67.316)


def test_scrape_http_errors_are_counted(server: HTTPServer) -> None:
    port = server.server_address[1]
    missing = DcgmExporterCollector(f"http://127.0.0.1:{port}/nope", timeout_s=5).collect(1)
    assert missing.malformed == {"dcgm_http_404": 1} and missing.gpus == []
    server_gone = DcgmExporterCollector("http://127.0.0.1:1/metrics", timeout_s=2).collect(1)
    assert server_gone.malformed == {"dcgm_fetch": 1}


# --- garbage never raises --------------------------------------------------------------------

_PIECES = st.sampled_from([
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS", "{", "}",
    'gpu="0"', 'gpu="x"', 'UUID="GPU-1"', ",", " ", "\n", "# TYPE ", "# HELP ", "counter",
    "gauge", "9223372036854775794", "1e400", "NaN", "-5", "3.5", "\"", "\\", "=", "+Inf",
    "histogram", "_total", "2147483632", "\t", "#",
])


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.text(max_size=300),
                 st.lists(_PIECES, max_size=60).map("".join),
                 st.lists(st.sampled_from(_data_lines(T4)), max_size=5).flatmap(
                     lambda ls: st.lists(_PIECES, max_size=8).map(
                         lambda ps: "\n".join(ls) + "".join(ps)))))
def test_garbage_never_raises(text: str) -> None:
    reading = DcgmExporterCollector("http://unused").parse(text)
    assert all(n > 0 for n in reading.malformed.values())
    for gpu in reading.gpus:
        assert gpu.temperature_c is None or gpu.temperature_c < DCGM_INT32_BLANK


def test_type_line_decides_kind_over_table_and_unknown_stays_unknown() -> None:
    base = 'gpu="0",UUID="GPU-a",modelName="m",Hostname="h"'
    text = "\n".join([
        "# HELP DCGM_FI_DEV_NEW_ERRORS made-up future field",
        "# TYPE DCGM_FI_DEV_NEW_ERRORS counter",
        f"DCGM_FI_DEV_NEW_ERRORS{{{base}}} 4",
        "# TYPE DCGM_FI_DEV_RETIRED_SBE gauge",
        f"DCGM_FI_DEV_RETIRED_SBE{{{base}}} 1",
        f"DCGM_FI_DEV_OTHER_NEW{{{base}}} 2",
        f'go_goroutines{{{base}}} 9',
    ]) + "\n"
    kinds = {s.name: s.kind for s in parse_dcgm_text(text).series}
    assert kinds == {"DCGM_FI_DEV_NEW_ERRORS": "counter", "DCGM_FI_DEV_RETIRED_SBE": "gauge",
                     "DCGM_FI_DEV_OTHER_NEW": "unknown"}
