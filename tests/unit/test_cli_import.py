"""`trainguard import kmsg|faults|steps`: files a user has -> an event log `replay --log` takes;
bad input is one line naming file, line, field and value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.cli.main import main
from trainguard.events.codec import decode
from trainguard.events.envelope import Event
from trainguard.events.payloads import NodeHealth, StepReport
from trainguard.offline.imports import kmsg_events

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
T0 = 1_796_119_200  # 2026-12-01T10:00:00Z, seconds


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    got = capsys.readouterr()
    return code, got.out, got.err


def _events(path: Path) -> list[Event]:
    return [decode(line) for line in path.read_bytes().splitlines() if line.strip()]


def _trace(path: Path, rows: int = 6, ranks: int = 4, slow: int | None = None) -> Path:
    lines = ["ts,worker,iter,fwd_bwd_ms,pid"]
    for s in range(rows):
        for r in range(ranks):
            ms = 500.0 * (2.0 if r == slow and s >= 2 else 1.0)
            lines.append(f"{T0 + s},{r},{s},{ms},{4000 + r}")
    path.write_text("\n".join(lines) + "\n")
    return path


MAP = "rank=worker,step=iter,compute_ms=fwd_bwd_ms,time=ts,pid=pid"


def test_import_kmsg_writes_valid_events_in_order_and_twice_the_same(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = FIXTURES / "kernel" / "captured" / "docker-for-linux-1001.syslog.log"
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for out in (a, b):
        code, _, err = _run(["import", "kmsg", str(src), "--node", "n1", "--job-id", "j",
                             "--year", "2021", "--out", str(out)], capsys)
        assert code == 0, err
    assert a.read_bytes() == b.read_bytes()
    evs = _events(a)
    # one-second stamps: the log is in (event_time, event_id) order
    assert sorted(e.payload.code or 0 for e in evs if isinstance(e.payload, NodeHealth)) == [
        15783, 15784, 15925]
    assert [e.event_time for e in evs] == sorted(e.event_time for e in evs)
    assert {(e.job_id, e.subject.node) for e in evs} == {("j", "n1")}
    assert "imported 3 events (3 node.health)" in err


def test_import_kmsg_reports_unreadable_lines_and_keeps_the_rest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "k.log"
    src.write_text("[  1.0] NVRM: Xid (PCI:0000:3b:00) no code\n"
                   "[  2.0] NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.\n")
    code, out, err = _run(["import", "kmsg", str(src), "--node", "n1"], capsys)
    assert code == 0
    assert len(out.splitlines()) == 1
    assert f"{src}: skipped 1 unreadable line(s) (xid 1); first: {src}:1: xid" in err


def test_import_steps_csv_with_a_mapping(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "steps.jsonl"
    code, _, err = _run(["import", "steps", str(_trace(tmp_path / "t.csv")), "--map", MAP,
                         "--job-id", "train-1", "--node", "n1", "--out", str(out)], capsys)
    assert code == 0, err
    evs = _events(out)
    assert len(evs) == 24
    first = evs[0]
    assert isinstance(first.payload, StepReport)
    assert (first.job_id, first.subject.node, first.subject.rank) == ("train-1", "n1", 0)
    assert (first.payload.world_size, first.payload.compute_ms, first.payload.pid) == (4, 500.0,
                                                                                      4000)
    assert first.event_time == T0 * 1_000_000


def test_import_steps_jsonl(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "t.jsonl"
    src.write_text("\n".join(json.dumps({"t": f"2026-12-01T10:00:0{s}Z", "r": r, "s": s,
                                         "c": 100 + r, "job": "jj"})
                             for s in range(3) for r in range(2)) + "\n")
    code, out, err = _run(["import", "steps", str(src), "--map",
                           "rank=r,step=s,compute_ms=c,time=t,job=job"], capsys)
    assert code == 0, err
    evs = [decode(x) for x in out.encode().splitlines()]
    assert {e.job_id for e in evs} == {"jj"} and len(evs) == 6


@pytest.mark.parametrize(("row", "want"), [
    ("x,0,0,500,1", "t.csv: line 3: field 'time' (column 'ts'):"),
    (f"{T0},0,0,fast,1", "t.csv: line 3: field 'compute_ms' (column 'fwd_bwd_ms'): not a "
                         "number (got 'fast')"),
    (f"{T0},-1,0,500,1", "t.csv: line 3: field 'rank' (column 'worker'): Input should be "
                         "greater than or equal to 0 (got -1)"),
    (f"{T0},0,0,,1", "t.csv: line 3: field 'compute_ms' (column 'fwd_bwd_ms'): missing"),
])
def test_a_bad_trace_row_is_one_line_naming_file_line_field_and_value(
        row: str, want: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "t.csv"
    src.write_text(f"ts,worker,iter,fwd_bwd_ms,pid\n{T0},0,0,500,1\n{row}\n")
    out = tmp_path / "o.jsonl"
    code, _, err = _run(["import", "steps", str(src), "--map", MAP, "--out", str(out)], capsys)
    assert code == 2
    assert len(err.splitlines()) == 1 and want in err, err
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize(("mapping", "want"), [
    ("rank=worker,step=iter", "--map: no column for compute_ms (needs rank, step, compute_ms)"),
    ("rank=worker,speed=x,step=iter,compute_ms=a,time=ts", "--map: unknown field 'speed'"),
    ("rank", "--map: 'rank' is not field=column"),
    ("rank=nope,step=iter,compute_ms=fwd_bwd_ms,time=ts", "line 2: no column 'nope' (mapped to "
                                                          "'rank')"),
])
def test_a_bad_mapping_is_one_line(mapping: str, want: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["import", "steps", str(_trace(tmp_path / "t.csv")), "--map", mapping],
                        capsys)
    assert code == 2 and len(err.splitlines()) == 1 and want in err, err


def test_import_faults_and_a_bad_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "f.csv"
    src.write_text("node,start,end,fault_class\nn1,2026-12-01T10:00:00Z,2026-12-01T10:05:00Z,"
                   "gpu\nn2,2026-12-01T10:01:00Z,,network\n")
    out = tmp_path / "f.jsonl"
    code, _, err = _run(["import", "faults", str(src), "--out", str(out)], capsys)
    assert code == 0, err
    evs = _events(out)
    assert [(e.job_id, e.payload.kind.value) for e in evs  # type: ignore[attr-defined]
            ] == [("node:n1", "external_fault_start"), ("node:n2", "external_fault_start"),
                  ("node:n1", "external_fault_end")]
    src.write_text("node,start,end,fault_class\nn1,2026-12-01T10:00:00Z,,gpu\n"
                   "n2,yesterday,,gpu\n")
    code, _, err = _run(["import", "faults", str(src)], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"{src}: line 3: field 'start': 'yesterday' is neither ISO-8601 nor an epoch" in err


def test_not_utf8_names_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "k.log"
    src.write_bytes(b"[ 1.0] fine\n[ 2.0] bad \xff here\n")
    code, _, err = _run(["import", "kmsg", str(src), "--node", "n1"], capsys)
    assert code == 2 and f"{src}: line 2: not valid UTF-8" in err


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=2000), node=st.sampled_from(["n1", "gpu-7"]))
def test_import_kmsg_never_raises_on_any_text(data: bytes, node: str) -> None:
    got = kmsg_events(data.decode("utf-8", errors="replace"), name="f", node=node)
    for e in got.events:
        assert isinstance(e.payload, NodeHealth)


def test_the_users_path_import_then_replay_log(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A step trace, a kernel log with an OOM kill of rank 2's process and a fault log,
    imported and concatenated: `replay --log --json` finds the verdicts and incidents."""
    steps, kmsg, faults = (tmp_path / n for n in ("s.jsonl", "k.jsonl", "f.jsonl"))
    trace = _trace(tmp_path / "t.csv", rows=20)
    assert _run(["import", "steps", str(trace), "--map", MAP, "--job-id", "train-1", "--node",
                 "n1", "--out", str(steps)], capsys)[0] == 0
    klog = tmp_path / "dmesg.txt"
    klog.write_text("[Tue Dec  1 10:00:05 2026] Out of memory: Killed process 4002 (python) "
                    "total-vm:1kB, anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0\n")
    assert _run(["import", "kmsg", str(klog), "--node", "n1", "--job-id", "train-1", "--out",
                 str(kmsg)], capsys)[0] == 0
    flog = tmp_path / "faults.csv"
    flog.write_text("node,start,end,fault_class\nn7,2026-12-01T10:00:01Z,2026-12-01T10:00:09Z,"
                    "maintenance\n")
    assert _run(["import", "faults", str(flog), "--out", str(faults)], capsys)[0] == 0
    log = tmp_path / "log.jsonl"
    log.write_bytes(steps.read_bytes() + kmsg.read_bytes() + faults.read_bytes())
    code, out, err = _run(["replay", "--log", str(log), "--json"], capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["mode"] == "what_if_unrecorded" and doc["exit_code"] == 0
    found = [(v["job_id"], v["kind"], v["state"], v["subject"]) for v in doc["verdicts"]["new"]]
    assert ("train-1", "oom_kill", "open", {"node": "n1", "rank": 2}) in found
    assert ("node:n7", "external_fault", "open", {"node": "n7"}) in found
    assert ("node:n7", "external_fault", "resolved", {"node": "n7"}) in found
    oom = next(v for v in doc["verdicts"]["new"] if v["kind"] == "oom_kill")
    assert oom["severity"] == "critical" and oom["evidence"]["pid"] == 4002
    appear = {(s["job_id"], s["final_state"]) for s in doc["incidents"]["appear"]}
    assert ("node:n7", "recovered") in appear
    assert any(j == "train-1" for j, _ in appear)


def test_an_untimed_public_trace_imports_on_a_step_axis_and_replays(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Alibaba's mini-batch times (tests/fixtures/alibaba: worker, iteration, normalised time;
    no wall clock): step N lands at --start-time + N x --step-interval-ms; the rules find the one
    straggler the dataset labels (worker 6, iterations ~1810-1940)."""
    out = tmp_path / "a.jsonl"
    code, _, err = _run(["import", "steps", str(FIXTURES / "alibaba" / "job_1_norm.csv"),
                         "--map", "rank=worker,step=time,compute_ms=batch_time_norm", "--job-id",
                         "alibaba-1", "--start-time", "2026-12-01T00:00:00Z", "--out", str(out)],
                        capsys)
    assert code == 0, err
    evs = _events(out)
    first = min(evs, key=lambda e: e.event_time)
    assert isinstance(first.payload, StepReport) and first.payload.step == 1
    assert first.event_time == T0 * 1_000_000 - 10 * 3600 * 1_000_000 + 1_000_000
    assert {e.payload.world_size for e in evs if isinstance(e.payload, StepReport)} == {10}
    code, text, err = _run(["replay", "--log", str(out), "--json"], capsys)
    assert code == 0, err
    opened = [(v["kind"], v["subject"]["rank"]) for v in json.loads(text)["verdicts"]["new"]
              if v["state"] == "open"]
    assert opened == [("straggler", 6)]
