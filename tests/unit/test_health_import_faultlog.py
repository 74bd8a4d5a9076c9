"""Importing node fault logs (JSON lines, CSV): events, times, and bad rows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.collectors.base import Discrete
from trainguard.collectors.health_import import (
    FaultLogFollower,
    RowError,
    import_fault_log,
    import_fault_log_text,
    parse_time_us,
)
from trainguard.events.payloads import NodeHealth
from trainguard.events.payloads import NodeHealthKind as K

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "health"
T10 = 1_796_119_200_000_000  # 2026-12-01T10:00:00Z


def _rows(discrete: list[Discrete]) -> list[tuple[str | None, K, str | None, int]]:
    out = []
    for d in discrete:
        p = d.payload
        assert isinstance(p, NodeHealth)
        out.append((d.subject.node, p.kind, p.fault_class, d.event_time))
    return out


def _kinds(discrete: list[Discrete]) -> list[K]:
    return [d.payload.kind for d in discrete if isinstance(d.payload, NodeHealth)]


def test_jsonl_fixture_imports_good_rows_and_names_bad_ones() -> None:
    result = import_fault_log(FIXTURES / "faults.jsonl")
    assert _rows(result.discrete) == [
        ("gpu-node-17", K.EXTERNAL_FAULT_START, "gpu_xid_79", T10),
        ("gpu-node-17", K.EXTERNAL_FAULT_END, "gpu_xid_79", T10 + 42 * 60_000_000),
        ("gpu-node-18", K.EXTERNAL_FAULT_START, "nic_flap", T10),
        ("gpu-node-21", K.EXTERNAL_FAULT_START, "nvlink", T10 + 123_000),
        ("gpu-node-21", K.EXTERNAL_FAULT_END, "nvlink", T10 + 60_123_000),
    ]
    assert [(e.row, e.field) for e in result.errors] == [(3, "start"), (4, None), (5, "end")]
    assert str(result.errors[0]).startswith("row 3: field 'start': 'yesterday'")
    assert "before start" in str(result.errors[2])
    assert result.to_reading().malformed == {"fault_log_row": 3}
    first = result.discrete[0]
    assert isinstance(first.payload, NodeHealth)
    assert first.payload.origin == "import"
    assert first.payload.message == "GPU fell off the bus; node drained"
    assert first.job_id == "node:gpu-node-17"
    last = result.discrete[-1].payload
    assert isinstance(last, NodeHealth) and last.code == 74


def test_csv_fixture() -> None:
    result = import_fault_log(FIXTURES / "faults.csv")
    assert _rows(result.discrete) == [
        ("gpu-node-17", K.EXTERNAL_FAULT_START, "gpu_xid_79", T10),
        ("gpu-node-17", K.EXTERNAL_FAULT_END, "gpu_xid_79", T10 + 42 * 60_000_000),
        ("gpu-node-18", K.EXTERNAL_FAULT_START, "nic_flap", T10 + 5 * 60_000_000),
        ("gpu-node-21", K.EXTERNAL_FAULT_START, "nvlink", T10),
        ("gpu-node-21", K.EXTERNAL_FAULT_END, "nvlink", T10 + 60_000_000),
    ]
    assert result.errors == [RowError(4, "node", "missing"), RowError(5, "fault_class", "missing")]
    msg = result.discrete[2].payload
    assert isinstance(msg, NodeHealth) and msg.message == 'link flapping, "ens1f0np0"'


def test_csv_row_with_too_many_values_and_a_bad_code() -> None:
    text = ("node,start,end,class,code\n"
            "n1,2026-12-01T10:00:00Z,,psu,1,extra\n"
            "n2,2026-12-01T10:00:00Z,,psu,abc\n"
            "n3,2026-12-01T10:00:00Z,,psu,7\n")
    result = import_fault_log_text(text, "csv")
    assert [(e.row, e.field) for e in result.errors] == [(2, None), (3, "code")]
    assert [d.subject.node for d in result.discrete] == ["n3"]


def test_explicit_job_id_and_bad_node_names() -> None:
    text = '{"node": "n1", "start": 1796119200, "class": "x"}\n' \
           '{"node": "bad node!", "start": 1796119200, "class": "x"}\n'
    default = import_fault_log_text(text, "jsonl")
    assert [(e.row, e.field) for e in default.errors] == [(2, "node")]
    fixed = import_fault_log_text(text, "jsonl", job_id="job-fleet")
    assert [d.job_id for d in fixed.discrete] == ["job-fleet", "job-fleet"]
    odd = import_fault_log_text('{"node": ["n1"], "start": 1, "class": "x"}\n'
                                '{"node": "n1", "start": 1, "class": {"a": 1}}\n', "jsonl")
    assert [(e.row, e.field) for e in odd.errors] == [(1, "node"), (2, "fault_class")]


@pytest.mark.parametrize("value,expected", [
    ("2026-12-01T10:00:00Z", T10),
    ("2026-12-01T11:00:00+01:00", T10),
    ("2026-12-01 10:00:00", T10),
    ("2026-12-01T10:00:00.5Z", T10 + 500_000),
    (1796119200, T10),
    (1796119200.25, T10 + 250_000),
    ("1796119200", T10),
    (1796119200000, T10),
    (1796119200000000, T10),
    (1796119200000000000, T10),
])
def test_time_forms(value: object, expected: int) -> None:
    assert parse_time_us(value) == expected


@pytest.mark.parametrize("value", ["", "soon", None, True, [], -5, float("nan"), 10**30, 10**400,
                                   "0001-01-01T00:00:00Z"])
def test_bad_times_raise_value_error(value: object) -> None:
    with pytest.raises(ValueError):
        parse_time_us(value)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=400))
def test_import_never_raises_on_any_text(text: str) -> None:
    for fmt in ("jsonl", "csv"):
        import_fault_log_text(text, fmt)


def test_follower_reports_each_event_once_and_late_ends(tmp_path: Path) -> None:
    path = tmp_path / "faults.jsonl"
    path.write_text('{"node": "n1", "start": "2026-12-01T10:00:00Z", "class": "psu"}\n'
                    'garbage\n')
    follower = FaultLogFollower(path)
    first = follower.collect(1)
    assert [d.payload.kind for d in first.discrete] == [K.EXTERNAL_FAULT_START]  # type: ignore[attr-defined]
    assert first.malformed == {"fault_log_row": 1}
    assert follower.collect(2).discrete == []
    # The fault log is rewritten: the row now has its end.
    path.write_text('{"node": "n1", "start": "2026-12-01T10:00:00Z", '
                    '"end": "2026-12-01T10:30:00Z", "class": "psu"}\ngarbage\n')
    os.utime(path, ns=(1, 10**18))
    second = follower.collect(3)
    assert [d.payload.kind for d in second.discrete] == [K.EXTERNAL_FAULT_END]  # type: ignore[attr-defined]
    assert second.malformed == {}  # the same bad row is not counted twice
    assert FaultLogFollower(tmp_path / "missing.jsonl").collect(1).discrete == []


_scalar = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
           | st.sampled_from(["2026-12-01T10:00:00Z", "1796119200", "", "n1"]))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.dictionaries(
    st.sampled_from(["node", "hostname", "start", "start_time", "end", "class", "fault_class",
                     "code", "message", "other"]), _scalar | st.lists(_scalar, max_size=2)),
    max_size=5))
def test_import_never_raises_on_any_json_rows(rows: list[dict[str, object]]) -> None:
    text = "\n".join(json.dumps(r) for r in rows)
    result = import_fault_log_text(text, "jsonl")
    assert len(result.errors) <= len(rows)
