"""The compiled msgspec gate (``events/fastpath.py``) agrees with the pydantic codec: it never
accepts what pydantic refuses, and what it accepts becomes the very same event."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import events
from trainguard.events import ContractError, decode, encode, fastpath
from trainguard.events import payloads as p
from trainguard.events.registry import BY_NAME, EventType
from trainguard.events.samples import sample_events

pytestmark = pytest.mark.unit

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
    | st.floats(allow_nan=False, allow_infinity=False, min_value=-1e300, max_value=1e300)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)
_SAMPLES = [encode(e) for e in sample_events() if e.type in fastpath.FAST_TYPES]


def _agree(raw: bytes) -> None:
    """decode_fast and decode give the same event, or both refuse."""
    try:
        slow = decode(raw)
    except ContractError as err:
        with pytest.raises(ContractError) as info:
            fastpath.decode_fast(raw)
        assert str(info.value) == str(err)  # refused by pydantic, with pydantic's words
        return
    fast = fastpath.decode_fast(raw)
    assert type(fast) is type(slow) and type(fast.payload) is type(slow.payload)
    assert fast == slow
    assert encode(fast) == encode(slow)


def test_the_hot_types_are_compiled() -> None:
    hot = {"telemetry.node", "node.health", "step.report", "process.exit"}
    assert hot <= fastpath.FAST_TYPES
    # types with validators are left to pydantic, by name: signed commands and outcomes, and
    # heartbeat v2 (section and section_start: both set or both absent)
    assert not {"command", "heartbeat"} & fastpath.FAST_TYPES


@pytest.mark.parametrize("spec", [BY_NAME[n] for n in sorted(fastpath.FAST_TYPES)],
                         ids=lambda s: s.name)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_every_compiled_type_passes_the_gate_as_the_same_event(
        spec: EventType, data: st.DataObject) -> None:
    event = data.draw(events(spec))
    raw = encode(event)
    loss = event.payload.loss if isinstance(event.payload, p.StepReport) else None
    if loss is not None and not math.isfinite(loss):
        return  # a NaN loss travels as a string: the gate leaves it to pydantic (tested below)
    struct = fastpath.decode_struct(raw)  # the gate accepts every valid current record
    # the same event as the codec reads from these bytes (a non-finite number in a flat map
    # travels as null, so the drawn event itself may differ from what any consumer reads)
    assert fastpath.to_event(struct) == decode(raw)
    assert encode(fastpath.to_event(struct)) == raw
    _agree(raw)


@given(raw=st.sampled_from(_SAMPLES), data=st.data())
@settings(max_examples=250, deadline=None)
def test_a_field_replaced_by_any_json_is_judged_alike(raw: bytes, data: st.DataObject) -> None:
    doc: Any = orjson.loads(raw)
    target = doc
    while True:
        key = data.draw(st.sampled_from(sorted(target)))
        child = target[key]
        if isinstance(child, dict) and child and data.draw(st.booleans()):
            target = child
            continue
        if isinstance(child, list) and child and isinstance(child[0], dict) \
                and data.draw(st.booleans()):
            target = child[data.draw(st.integers(0, len(child) - 1))]
            continue
        target[key] = data.draw(_JSON)
        break
    _agree(json.dumps(doc).encode())


@given(raw=st.sampled_from(_SAMPLES), data=st.data())
@settings(max_examples=200, deadline=None)
def test_flipped_or_cut_bytes_are_judged_alike(raw: bytes, data: st.DataObject) -> None:
    buf = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(buf)))
    _agree(bytes(buf[:cut] if data.draw(st.booleans()) else buf))


@given(st.binary(max_size=200))
@settings(max_examples=200, deadline=None)
def test_arbitrary_bytes_are_judged_alike(raw: bytes) -> None:
    _agree(raw)


@pytest.mark.parametrize(("path", "value"), [
    (("event_id",), "abcdefgh\n"),  # `$` in a pattern: end of text, not before a newline
    (("job_id",), "job-demo\n"),
    (("payload", "compute_ms"), 1e308 * 10),  # inf (json.dumps writes Infinity)
    (("payload", "compute_ms"), "5"),  # lax coercion: pydantic's call, not the gate's
    (("payload", "step"), 5.0),
    (("payload", "rank"), True),
    (("schema_version",), 1),  # an old version is upcast by pydantic's path
    (("payload", "bogus"), 1),
])
def test_edge_values_are_judged_alike(path: tuple[str, ...], value: object) -> None:
    raw = encode(next(e for e in sample_events() if e.type == "step.report"))
    doc: Any = orjson.loads(raw)
    target = doc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    edited = json.dumps(doc).encode()
    with pytest.raises(ContractError):
        fastpath.decode_struct(edited)  # the gate is the stricter one...
    _agree(edited)  # ...and the fallback gives pydantic's verdict


def test_a_required_subject_field_is_enforced_after_the_gate() -> None:
    raw = encode(next(e for e in sample_events() if e.type == "step.report"))
    doc: Any = orjson.loads(raw)
    doc["subject"]["rank"] = None
    edited = json.dumps(doc).encode()
    fastpath.decode_struct(edited)  # the shape is fine...
    with pytest.raises(ContractError, match=r"subject\.rank: required for step\.report"):
        fastpath.decode_fast(edited)  # ...the registry's requirement is not
    _agree(edited)


def test_an_8_gpu_node_record_passes_the_gate() -> None:
    from bench.bench_codec import node_record

    raw = node_record()
    assert fastpath.to_event(fastpath.decode_struct(raw)) == decode(raw)


def test_an_exit_with_its_declaration_agrees_and_a_bad_one_is_refused_alike() -> None:
    from trainguard.events.codec import make_event
    from trainguard.events.envelope import Subject

    ev = make_event(p.ProcessExit(pid=5, rank=1, declared_code=3,
                                  declared_cause=p.DepartureCause.PEER_LOST,
                                  declared_reason="lost a peer"),
                    event_id="a" * 32, job_id="j", event_time=1, source="agent@n",
                    subject=Subject(node="n", rank=1))
    raw = encode(ev)
    assert "process.exit" in fastpath.FAST_TYPES
    _agree(raw)
    assert fastpath.decode_fast(raw).payload == ev.payload
    for good, bad in ((b'"peer_lost"', b'"bored"'), (b'"declared_code":3', b'"declared_code":300')):
        mangled = raw.replace(good, bad)
        assert mangled != raw
        with pytest.raises(ContractError):
            decode(mangled)
        _agree(mangled)
