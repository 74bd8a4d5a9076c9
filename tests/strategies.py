"""Hypothesis strategies derived from the pydantic payload models, so every event type is
property-tested without a hand-written strategy per field."""

from __future__ import annotations

import enum
import re
import types
import typing
from typing import Any

import annotated_types as at
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.registry import EVENT_TYPES, EventType

_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FFF, exclude_categories=["Cs"]),
                min_size=1, max_size=12)


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in metadata:
        for name in ("ge", "gt", "le", "lt", "min_length", "max_length", "pattern",
                     "allow_inf_nan"):
            value = getattr(m, name, None)
            if value is not None and not isinstance(m, type):
                out[name] = value
        if isinstance(m, at.Interval):
            out.update({k: v for k, v in vars(m).items() if v is not None})
    return out


def for_annotation(annotation: Any, metadata: list[Any] | None = None) -> st.SearchStrategy[Any]:
    metadata = list(metadata or [])
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        base, *extra = typing.get_args(annotation)
        for e in extra:
            metadata.extend(getattr(e, "metadata", []) or [e])
        return for_annotation(base, metadata)
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(for_annotation(a, metadata) for a in typing.get_args(annotation)))
    if origin is typing.Literal:
        return st.sampled_from(typing.get_args(annotation))
    if origin is list:
        (item,) = typing.get_args(annotation)
        least = _bounds(metadata).get("min_length", 0)
        return st.lists(for_annotation(item), min_size=least, max_size=max(3, least))
    if origin is dict:
        key, value = typing.get_args(annotation)
        return st.dictionaries(for_annotation(key), for_annotation(value), max_size=3)
    if annotation is type(None):
        return st.none()
    b = _bounds(metadata)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        lo = b.get("ge", b["gt"] + 1 if "gt" in b else -(2**40))
        hi = b.get("le", b["lt"] - 1 if "lt" in b else 2**40)
        return st.integers(min_value=lo, max_value=min(hi, 2**53 - 1))
    if annotation is float:
        allow = b.get("allow_inf_nan", True)
        return st.floats(min_value=b.get("ge", b.get("gt")), max_value=b.get("le", b.get("lt")),
                         exclude_min="gt" in b, exclude_max="lt" in b,
                         allow_nan=allow and not ({"ge", "gt", "le", "lt"} & set(b)),
                         allow_infinity=allow and not ({"ge", "gt", "le", "lt"} & set(b)))
    if annotation is str:
        if "pattern" in b:
            return st.from_regex(re.compile(b["pattern"]), fullmatch=True).filter(
                lambda s: len(s) <= b.get("max_length", 10**6))
        return _TEXT
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return st.sampled_from(list(annotation))
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return for_model(annotation)
    raise NotImplementedError(f"no strategy for {annotation!r}")


def for_model(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    fields = {
        name: for_annotation(info.annotation, list(info.metadata))
        for name, info in model.model_fields.items()
    }
    # a model's own validators (e.g. fields set together) refuse some drawn combinations
    return st.fixed_dictionaries(fields).map(lambda kw: _valid(model, _keyed_by_action(kw))) \
        .filter(lambda m: m is not None)


def _valid(model: type[BaseModel], kw: dict[str, Any]) -> BaseModel | None:
    try:
        return model(**kw)
    except ValidationError:
        return None


def _keyed_by_action(kw: dict[str, Any]) -> dict[str, Any]:
    """A command's params and an outcome's data are the model of its action: the drawn
    params/data decide the action."""
    for inner in kw.values():
        if "action" in kw and isinstance(inner, BaseModel) and hasattr(inner, "action"):
            return {**kw, "action": inner.action}
    return kw


def _subject_for(spec: EventType) -> st.SearchStrategy[Subject]:
    base = for_model(Subject)

    def complete(s: Subject) -> Subject:
        need: set[str] = set(spec.requires_subject)
        fill = {f: ("node-x" if f in ("node", "link", "unit") else 0)
                for f in need if getattr(s, f) is None}
        return s.model_copy(update=fill) if fill else s

    return base.map(complete)


@st.composite
def events(draw: st.DrawFn, spec: EventType | None = None) -> Event:
    spec = spec or draw(st.sampled_from(EVENT_TYPES))
    payload = draw(for_model(spec.payload))
    return make_event(
        payload,
        event_id=draw(st.from_regex(r"[A-Za-z0-9_-]{8,32}", fullmatch=True)),
        job_id=draw(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}", fullmatch=True)),
        event_time=draw(st.integers(0, 2**53 - 1)),
        ingest_time=draw(st.none() | st.integers(0, 2**53 - 1)),
        source=draw(_TEXT),
        subject=draw(_subject_for(spec)),
    )
