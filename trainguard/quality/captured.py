"""Quality-suite cases from captured real output: kernel logs from public bug reports
(tests/fixtures/kernel/captured), dcgm-exporter scrapes and nvidia-smi output (tests/fixtures/
gpu), and an external fault feed with overlapping faults (generated here as the CSV a cluster
exports). Every verdict kind is scored: a healthy capture must give no verdict of any kind.

Expectations come from what each log says, not from what the rules gave: an XID's class is
NVIDIA's catalogue (docs/rules.md, ``xid``); an OOM kill whose victim is no rank's process is
memory pressure at the node; a victim that is a rank's process is that rank's failure. Times
are the lines' own stamps (the case's unit: seconds from its first event).
"""

from __future__ import annotations

import random
from datetime import datetime
from pathlib import Path

from trainguard.collectors.gpu.dcgm_parse import parse_dcgm_text, to_gpu_samples
from trainguard.collectors.gpu.smi_parse import parse_smi_csv, parse_smi_xml
from trainguard.compat import UTC
from trainguard.events.envelope import Event
from trainguard.events.payloads import GpuSample, VerdictKind
from trainguard.offline.imports import fault_events, kmsg_events
from trainguard.quality.cases import Case, Expect
from trainguard.rules.synth import step_report, telemetry

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures"
KERNEL = FIXTURES / "kernel" / "captured"
GPU = FIXTURES / "gpu"
EVERY_KIND = frozenset(k.value for k in VerdictKind)
SECOND = 1_000_000
BOOT = 1_764_000_000_000_000  # the boot time given to monotonic ([  12.3]) stamps
NODE = "n1"


def _at(y: int, mo: int, d: int, h: int = 0, mi: int = 0, s: int = 0) -> int:
    dt = datetime(y, mo, d, h, mi, s, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (dt.days * 86_400 + dt.seconds) * SECOND


def _sorted(events: list[Event]) -> list[Event]:
    return sorted(events, key=lambda e: (e.event_time, e.event_id))


def _job(name: str) -> str:
    return f"kmsg-{name.split('.')[0]}"


def _kmsg(name: str, year: int) -> list[Event]:
    text = (KERNEL / name).read_text(encoding="utf-8")
    return _sorted(kmsg_events(text, name=name, node=NODE, job_id=_job(name),
                               boot_time_us=BOOT, year=year).events)


# file, year for year-less stamps, time of its first line's signal, expected verdicts
# (kind, at the node or not, seconds after the first signal), why
_KERNEL: list[tuple[str, int, int, tuple[tuple[str, bool, int], ...], str]] = [
    ("akash-support-244.dmesg-T.log", 2024, _at(2024, 7, 31, 23, 14, 18),
     (("xid_app", False, 0), ("xid_app", False, 362395), ("xid_other", True, 742718)),
     "XID 43 (app, job), 31 days later 31 (app), 94 contained ECC (GPU/node warning)"),
    ("gpud-46.dmesg-T.log", 2024, _at(2024, 8, 30, 11, 43, 9),
     (("xid_app", False, 0), ("xid_other", True, 5)),
     "XID 13 twice (one app verdict), then 109 context-switch timeout at the node"),
    ("nixpkgs-539036.journal.log", 2025, _at(2025, 7, 6, 20, 2, 59),
     (("xid_app", False, 0),), "XID 13 graphics exception: the program's fault"),
    ("relate-1383.dmesg-T.log", 2025, _at(2025, 11, 21, 14, 22, 56),
     (("oom_kill_process", True, 0),), "OOM kill of a non-rank process: node pressure"),
    ("py-autovod-7.dmesg-T.log", 2025, _at(2025, 3, 30, 8, 24, 0),
     (("oom_kill_process", True, 0),), "global OOM kill: node pressure"),
    ("reportportal-kubernetes-203.dmesg.log", 2026, BOOT + 7063_247407,
     (("oom_kill_process", True, 0),), "memcg OOM kill: node pressure"),
    ("netdata-10875.dmesg.log", 2026, BOOT + 1836_276684,
     (("oom_kill_process", True, 0),), "memcg OOM kill: node pressure"),
    ("rhel6-mysqld.dmesg.log", 2026, BOOT + 197352_008908,
     (("oom_kill_process", True, 0),), "UID-variant OOM kill: node pressure"),
    ("docker-for-linux-1001.syslog.log", 2021, _at(2021, 5, 15, 23, 9, 30),
     (("oom_kill_process", True, 0),), "three kills in a burst: one node verdict"),
    ("gpud-1209.journal.log", 2026, _at(2026, 2, 14, 5, 3, 41), (),
     "an InfiniBand port coming up: healthy, no verdict"),
    ("netlogo-53.syslog.log", 2022, BOOT, (), "no kernel signal at all"),
]


def _kernel_case(name: str, year: int, first: int, expect: tuple[tuple[str, bool, int], ...],
                 note: str) -> Case:
    return Case(_job(name), lambda: _kmsg(name, year),
                tuple(Expect(kind, None, s, s, s, NODE if at_node else None)
                      for kind, at_node, s in expect),
                kinds=EVERY_KIND, step_us=SECOND, start_us=first, note=note, unit="s",
                tags=("real", "kernel"))


# the docker-for-linux kills' victims (pids 15784, 15925, 15783) are ranks 0-2 of a job
OOM_LOG = "docker-for-linux-1001.syslog.log"
OOM_PIDS = {0: 15784, 1: 15925, 2: 15783, 3: 2001}
OOM_AT = _at(2021, 5, 15, 23, 9, 30)


def _oom_ranks() -> list[Event]:
    """The captured burst of three OOM kills, on a node whose 4 ranks report their pids (steps
    every 0.5 s from 30 s before the kills; the killed ranks report no further step)."""
    events = _kmsg(OOM_LOG, 2021)
    rng = random.Random(141)
    start = OOM_AT - 30 * SECOND
    for step in range(60):
        for rank, pid in OOM_PIDS.items():
            events.append(step_report(_job(OOM_LOG), rank, step,
                                      start + step * SECOND // 2 + rank * 10,
                                      100.0 * (1 + rng.uniform(-0.1, 0.1)), world=4,
                                      node=NODE, pid=pid))
    return _sorted(events)


def _smi_section(text: str, title: str) -> str:
    """The body of one ``# <phase> :: <what>`` section of an nvidia_gpu_exporter capture."""
    lines = text.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(f"# {title}"))
    while not lines[i + 1].startswith("####"):
        i += 1
    body: list[str] = []
    for ln in lines[i + 2:]:
        if ln.startswith("####"):
            break
        body.append(ln)
    return "\n".join(body)


def _gpus(name: str, section: str | None) -> list[GpuSample]:
    text = (GPU / name).read_text(encoding="utf-8")
    if name.endswith(".prom"):
        return to_gpu_samples(parse_dcgm_text(text))
    if name.endswith(".xml"):
        return parse_smi_xml(text).gpus
    assert section is not None
    return parse_smi_csv(_smi_section(text, section)).gpus


def _telemetry(name: str, section: str | None) -> list[Event]:
    """Two minutes of one-second telemetry holding the captured readings."""
    gpus = _gpus(name, section)
    job = f"gpu-{name}"
    return [telemetry(job, NODE, BOOT + i * SECOND, i, gpus) for i in range(120)]


H100 = "nvidia_gpu_exporter_linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.capture.txt"
H200 = "nvidia_gpu_exporter_linux-x86_64__nvidia-h200-mig__590.48.01.capture.txt"
_GPU: list[tuple[str, str, str | None, str]] = [
    ("dcgm-8xH100", "aicr_eks_8xH100_metrics.prom", None, "dcgm-exporter, 8 H100 on EKS"),
    ("dcgm-T4-load", "ericsson_T4_metrics.prom", None, "dcgm-exporter, T4 under load"),
    ("dcgm-L4", "kops_L4_metrics.prom", None, "dcgm-exporter, L4"),
    ("dcgm-L40S", "upcloud_L40S_metrics.prom", None, "dcgm-exporter, L40S"),
    ("smi-xml-A100", "telegraf_a100-sxm4-v12.xml", None, "nvidia-smi -q -x, A100"),
    ("smi-xml-T4", "telegraf_tesla-t4.xml", None, "nvidia-smi -q -x, T4"),
    ("smi-csv-H100-load", H100, "load :: query-gpu (csv", "nvidia-smi query CSV, H100 load"),
    ("smi-csv-H100-idle", H100, "idle :: query-gpu (csv", "nvidia-smi query CSV, H100 idle"),
    ("smi-csv-H200-mig", H200, "load :: query-gpu (csv", "nvidia-smi query CSV, H200 MIG"),
]


def _gpu_case(name: str, file: str, section: str | None, note: str) -> Case:
    return Case(name, lambda: _telemetry(file, section), kinds=EVERY_KIND, step_us=SECOND,
                start_us=BOOT, unit="s", note=f"{note}: healthy", tags=("real", "gpu"))


def _fault_feed() -> list[Event]:
    """A fault log of 40 nodes: overlapping faults of two classes on one node, two overlapping
    faults of one class on another, a fault that never ends, and 36 nodes with one fault each
    (start 10:00 + i min, 20 min long)."""
    rows = ["node,start_time,end_time,fault_class,description",
            "f0,2026-12-01T10:00:00Z,2026-12-01T10:30:00Z,gpu_xid_79,fell off the bus",
            "f0,2026-12-01T10:10:00Z,2026-12-01T10:20:00Z,nic_flap,link flapping",
            "f1,2026-12-01T10:00:00Z,2026-12-01T10:20:00Z,psu,psu 1",
            "f1,2026-12-01T10:10:00Z,2026-12-01T10:40:00Z,psu,psu 2",
            "f2,2026-12-01T10:05:00Z,,ecc_dbe,no end recorded"]
    for i in range(36):
        rows.append(f"g{i},2026-12-01T10:{i:02d}:00Z,2026-12-01T10:{i + 20:02d}:00Z,"
                    f"nvlink,link {i}")
    return _sorted(fault_events("\n".join(rows) + "\n", name="feed.csv", fmt="csv",
                                job_id="feed").events)


FEED_T0 = _at(2026, 12, 1, 10, 0, 0)


def _feed_case() -> Case:
    minute = 60
    expect = [Expect("external_fault", None, 0, 0, 0, "f0"),
              Expect("external_fault", None, 10 * minute, 10 * minute, 10 * minute, "f0"),
              Expect("external_fault", None, 0, 0, 0, "f1"),
              Expect("external_fault", None, 5 * minute, 5 * minute, 5 * minute, "f2")]
    expect += [Expect("external_fault", None, i * minute, i * minute, i * minute, f"g{i}")
               for i in range(36)]
    return Case("fault-feed-overlap", _fault_feed, tuple(expect), kinds=EVERY_KIND,
                step_us=SECOND, start_us=FEED_T0, unit="s", tags=("feed",),
                note="40 nodes; 2 classes overlapping on f0, 2 psu faults overlapping on f1")


def captured_cases() -> list[Case]:
    """The captured-data cases, where the source tree's fixtures are (not in a package)."""
    if not (KERNEL.is_dir() and GPU.is_dir()):
        return [_feed_case()]
    out = [_kernel_case(*k) for k in _KERNEL]
    out.append(Case("kmsg-oom-at-ranks", _oom_ranks,
                    tuple(Expect("oom_kill", r, 0, 0, 0, NODE) for r in (0, 1, 2)),
                    kinds=EVERY_KIND, step_us=SECOND, start_us=OOM_AT, unit="s",
                    tags=("real", "kernel"),
                    note="captured burst of 3 OOM kills; the victims are ranks 0-2"))
    out += [_gpu_case(name, f, s, note) for name, f, s, note in _GPU]
    out.append(_feed_case())
    return out
