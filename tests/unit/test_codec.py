from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import events
from trainguard.events import ContractError, Subject, decode, encode, make_event
from trainguard.events import payloads as p
from trainguard.events.registry import EVENT_TYPES, EventType
from trainguard.events.samples import sample_events


@pytest.mark.parametrize("spec", EVENT_TYPES, ids=lambda s: s.name)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_type_round_trips_to_identical_bytes(spec: EventType, data: st.DataObject) -> None:
    event = data.draw(events(spec))
    raw = encode(event)
    again = decode(raw)
    assert encode(again) == raw
    assert again.type == spec.name
    assert type(again.payload) is spec.payload


def test_samples_cover_every_type_and_round_trip() -> None:
    samples = sample_events()
    assert sorted(e.type for e in samples) == sorted(t.name for t in EVENT_TYPES)
    for ev in samples:
        assert decode(encode(ev)) == ev


def _step(**changes: object) -> dict[str, object]:
    ev = next(e for e in sample_events() if e.type == "step.report")
    doc: dict[str, object] = orjson.loads(encode(ev))
    for path, value in changes.items():
        target: Any = doc
        *parents, leaf = path.split("__")
        for part in parents:
            target = target[part]
        target[leaf] = value
    return doc


@pytest.mark.parametrize(
    ("changes", "field", "value"),
    [
        ({"payload__compute_ms": "fast"}, "payload.compute_ms", "fast"),
        ({"payload__compute_ms": -1}, "payload.compute_ms", -1),
        ({"payload__step": 1.5}, "payload.step", 1.5),
        ({"event_time": "yesterday"}, "event_time", "yesterday"),
        ({"job_id": ""}, "job_id", ""),
        ({"payload__bogus": 1}, "payload.bogus", 1),
        ({"subject__rank": -3}, "subject.rank", -3),
    ],
)
def test_a_bad_field_is_named_with_its_value(changes: dict[str, object], field: str,
                                             value: object) -> None:
    with pytest.raises(ContractError) as info:
        decode(orjson.dumps(_step(**changes)))
    assert info.value.first.field == field
    assert info.value.first.value == value
    assert field in str(info.value) and repr(value) in str(info.value)


def test_unknown_type_and_newer_version_are_refused_by_name() -> None:
    with pytest.raises(ContractError, match=r"type: unknown event type"):
        decode(orjson.dumps(_step(type="step.reprot")))
    with pytest.raises(ContractError, match=r"schema_version: newer .* \(max 2\)"):
        decode(orjson.dumps(_step(schema_version=3)))


def test_garbage_is_refused_not_raised_as_something_else() -> None:
    for raw in (b"", b"not json", b"[1,2]", b'{"payload": 3}', b"\xff\xfe"):
        with pytest.raises(ContractError):
            decode(raw)


@given(st.binary(max_size=200))
@settings(max_examples=200)
def test_arbitrary_bytes_only_ever_raise_contract_errors(raw: bytes) -> None:
    try:
        decode(raw)
    except ContractError:
        pass


def test_step_report_v1_is_upcast_to_v2() -> None:
    v1 = {"event_id": "old00001", "type": "step.report", "schema_version": 1, "job_id": "j1",
          "subject": {"rank": 2}, "event_time": 10, "source": "sdk-0.0",
          "payload": {"rank": 2, "world_size": 4, "step": 9, "data_position": 288,
                      "compute_ms": 10.0}}
    ev = decode(orjson.dumps(v1))
    assert ev.schema_version == 2
    assert isinstance(ev.payload, p.StepReport)
    assert ev.payload.samples_consumed == 288
    assert ev.payload.binding_epoch == 0


def test_nan_loss_travels_as_a_string_and_comes_back_nan() -> None:
    ev = make_event(p.StepReport(rank=0, world_size=1, step=1, samples_consumed=1, compute_ms=1,
                                 loss=float("nan")),
                    event_id="nanloss01", job_id="j", event_time=1, source="t",
                    subject=Subject(rank=0))
    raw = encode(ev)
    assert b'"loss":"NaN"' in raw
    loss = decode(raw).payload.loss  # type: ignore[attr-defined]
    assert loss != loss


def test_subject_requirements_are_enforced() -> None:
    with pytest.raises(ContractError, match=r"subject\.node"):
        make_event(p.NodeTelemetry(interval_ms=1000, seq=0), event_id="tele0001", job_id="j",
                   event_time=1, source="t")
    with pytest.raises(ContractError, match=r"subject\.rank"):
        make_event(p.Heartbeat(rank=1), event_id="hb000001", job_id="j", event_time=1,
                   source="t", subject=Subject(node="n"))


def test_measurements_refuse_nan() -> None:
    with pytest.raises(ValueError, match="compute_ms"):
        p.StepReport(rank=0, world_size=1, step=1, samples_consumed=1, compute_ms=float("nan"))


# --- no poison pill: decode refuses anything that is not an event with ContractError only ----

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)
_SAMPLES = [encode(e) for e in sample_events()]


def _only_contract_errors(raw: bytes | None) -> None:
    try:
        event = decode(raw)
    except ContractError as err:
        assert err.errors and str(err)  # a reason a dead letter can carry
    else:
        assert decode(encode(event)) == event  # what is accepted is a whole event


def test_a_tombstone_is_refused_by_name() -> None:
    with pytest.raises(ContractError, match=r"<record>: null value \(a tombstone\)") as info:
        decode(None)
    assert info.value.first.field == "<record>"
    for raw in (b"", b"null", b"\x00", b"\xc3\x28", b'"text"', b"42", b"{}"):
        with pytest.raises(ContractError):
            decode(raw)


@given(doc=_JSON)
@settings(max_examples=300, deadline=None)
def test_any_json_value_only_ever_raises_contract_errors(doc: object) -> None:
    _only_contract_errors(json.dumps(doc).encode())  # big ints too


@given(raw=st.sampled_from(_SAMPLES), data=st.data())
@settings(max_examples=400, deadline=None)
def test_a_valid_event_with_flipped_or_cut_bytes_only_ever_raises_contract_errors(
        raw: bytes, data: st.DataObject) -> None:
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    _only_contract_errors(bytes(buf[:cut] if data.draw(st.booleans()) else buf))


@given(raw=st.sampled_from(_SAMPLES), data=st.data())
@settings(max_examples=400, deadline=None)
def test_a_valid_event_with_any_field_replaced_only_ever_raises_contract_errors(
        raw: bytes, data: st.DataObject) -> None:
    doc = orjson.loads(raw)
    target = doc
    while True:  # walk down to a random field and replace it by any JSON value
        key = data.draw(st.sampled_from(sorted(target)))
        child = target[key]
        if isinstance(child, dict) and child and data.draw(st.booleans()):
            target = child
            continue
        target[key] = data.draw(_JSON)
        break
    _only_contract_errors(json.dumps(doc).encode())  # big ints too
