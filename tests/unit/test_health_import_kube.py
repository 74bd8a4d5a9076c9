"""Kubernetes node conditions -> NODE_CONDITION for the unhealthy ones."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.collectors.health_import import NodeConditionCollector, node_condition_events
from trainguard.events.payloads import NodeHealth
from trainguard.events.payloads import NodeHealthKind as K

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "health"
DOC = (FIXTURES / "node_conditions.json").read_text(encoding="utf-8")
T10 = 1_796_119_200_000_000  # 2026-12-01T10:00:00Z


def _payloads(doc: Any) -> list[tuple[str | None, str | None, int, str]]:
    result, _ = node_condition_events(doc)
    out = []
    for d in result.discrete:
        assert isinstance(d.payload, NodeHealth)
        assert d.payload.kind is K.NODE_CONDITION and d.payload.origin == "kubernetes"
        out.append((d.subject.node, d.payload.fault_class, d.event_time, d.payload.message))
    return out


def test_fixture_node_unhealthy_conditions_and_bad_row() -> None:
    assert _payloads(DOC) == [
        ("gpu-node-17", "ReadonlyFilesystem", T10 - 2 * 60_000_000,
         "ReadonlyFilesystem=True (FilesystemIsReadOnly): Filesystem is read-only"),
        ("gpu-node-17", "MemoryPressure", T10 + 60_000_000,
         "MemoryPressure=True (KubeletHasInsufficientMemory): kubelet has insufficient memory "
         "available"),
        ("gpu-node-17", "Ready", T10 + 3 * 60_000_000,
         "Ready=Unknown (NodeStatusUnknown): Kubelet stopped posting node status."),
    ]
    result, _ = node_condition_events(DOC)
    (err,) = result.errors
    assert (err.row, err.field) == (5, "status")
    assert str(err).startswith("node gpu-node-17 .status.conditions[5]: field 'status': 'Maybe'")
    assert result.to_reading().malformed == {"node_condition": 1}


def _node(name: str, *conds: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "Node", "metadata": {"name": name}, "status": {"conditions": list(conds)}}


def _cond(ctype: str, status: str, t: str = "2026-12-01T10:00:00Z") -> dict[str, Any]:
    return {"type": ctype, "status": status, "lastTransitionTime": t}


def test_each_builtin_rule() -> None:
    doc = {"kind": "List", "items": [
        _node("a", _cond("Ready", "True"), _cond("Ready", "False"), _cond("DiskPressure", "True"),
              _cond("PIDPressure", "True"), _cond("NetworkUnavailable", "True"),
              _cond("MemoryPressure", "False"), _cond("MemoryPressure", "Unknown")),
        _node("b", _cond("KernelDeadlock", "True"), _cond("GpuDriverHealthy", "False")),
    ]}
    got = [(n, c) for n, c, _, _ in _payloads(doc)]
    assert got == [("a", "Ready"), ("a", "DiskPressure"), ("a", "PIDPressure"),
                   ("a", "NetworkUnavailable"), ("b", "KernelDeadlock")]
    positive, _ = node_condition_events(
        _node("b", _cond("GpuDriverHealthy", "False")),
        positive_conditions={"Ready", "GpuDriverHealthy"})
    assert len(positive.discrete) == 1


def test_bad_documents_are_one_error_each() -> None:
    for doc in ("not json", "[1, 2]"):
        result, _ = node_condition_events(doc)
        assert [e.where for e in result.errors] == ["document"]
    result, _ = node_condition_events(b'{"items": [{"metadata": {}}]}')
    assert [(e.where, e.field) for e in result.errors] == [("items[0]", "metadata.name")]
    assert node_condition_events(_node("n"))[0].errors == []


def test_bad_conditions_are_named_and_the_good_ones_kept() -> None:
    doc: dict[str, Any] = _node("n", _cond("DiskPressure", "True"))
    doc["status"]["conditions"][:0] = [
        "not an object", {"status": "True"},
        {"type": "DiskPressure", "status": "True", "lastTransitionTime": "x"}]
    result, _ = node_condition_events(doc)
    assert [(e.row, e.field) for e in result.errors] == [
        (0, None), (1, "type"), (2, "lastTransitionTime")]
    assert len(result.discrete) == 1


def test_collector_reports_each_transition_once() -> None:
    docs = [_node("n", _cond("Ready", "False", "2026-12-01T10:00:00Z")),
            _node("n", _cond("Ready", "False", "2026-12-01T10:00:00Z")),
            _node("n", _cond("Ready", "True", "2026-12-01T10:05:00Z")),
            _node("n", _cond("Ready", "False", "2026-12-01T10:09:00Z"))]
    it = iter(json.dumps(d) for d in docs)
    c = NodeConditionCollector(lambda: next(it))
    counts = [len(c.collect(i).discrete) for i in range(4)]
    assert counts == [1, 0, 0, 1]


def test_collector_counts_a_failed_fetch() -> None:
    def fail() -> str:
        raise OSError("kubectl: not found")

    assert NodeConditionCollector(fail).collect(1).malformed == {"node_condition_fetch": 1}


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    | st.sampled_from(["True", "False", "Unknown", "Ready", "2026-12-01T10:00:00Z"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(["type", "status", "lastTransitionTime", "reason", "message", "metadata",
                         "name", "conditions", "items", "x"]), inner, max_size=5),
    max_leaves=30)


@settings(max_examples=150, deadline=None)
@given(doc=_json, name=st.text(min_size=1, max_size=300))
def test_any_json_never_raises(doc: Any, name: str) -> None:
    node_condition_events({"metadata": {"name": name}, "status": {"conditions": [doc]}})
    if isinstance(doc, dict):
        node_condition_events(doc)
        node_condition_events(json.dumps(doc))


def test_they_are_collectors(tmp_path: Path) -> None:
    from trainguard.collectors.base import Collector
    from trainguard.collectors.health_import import FaultLogFollower

    cs: list[Collector] = [NodeConditionCollector(lambda: DOC),
                           FaultLogFollower(tmp_path / "f.csv")]
    assert [c.name for c in cs] == ["node_conditions", "fault_log"]
