"""The compiled decode path: msgspec Structs derived from the registry's pydantic models.

The contract stays in one place (``payloads.py``, ``envelope.py``, ``registry.py``): at import
this module walks each registered type's pydantic model tree and builds the equivalent msgspec
Struct, with the same field names, defaults, bounds, lengths and patterns (``msgspec.Meta``),
unknown fields forbidden, ``type`` as the tag and ``schema_version`` fixed to the current
version. msgspec validates the bytes in C and builds the Structs; the pydantic instances are then
assembled from them without a second validation.

Measured side by side (``bench/bench_codec.py``): the gate alone costs about what
``orjson.loads`` does (validation is nearly free once the bytes are parsed in C), but assembling
the pydantic objects in Python costs as much as pydantic's own ``validate_json`` in Rust, so
``codec.decode`` keeps pydantic; ``decode_fast`` is the selectable alternative, and the gate's
cost is what the edge would pay once consumers read the Structs.

It is a *gate*, never a second opinion: msgspec is at least as strict as pydantic (no lax
coercions, patterns anchored alike), so what it accepts pydantic accepts with the same values,
and anything it refuses (old versions, lax input such as ``"5"`` for an int, bad records) goes
to the careful pydantic path in ``codec.py``, which names the field and value. A type whose
model tree uses something this translation does not know (validators, unsupported types) is
simply left to pydantic; ``FAST_TYPES`` says which types are compiled.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types as at
import msgspec
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from trainguard.events import codec
from trainguard.events.envelope import Event, Subject
from trainguard.events.errors import ContractError, FieldError
from trainguard.events.registry import BY_NAME, EventType

_FLOAT_MAX = 1.7976931348623157e308  # finite bounds: JSON cannot carry NaN, this refuses inf


class Unsupported(Exception):
    """The model tree uses something the translation does not cover: pydantic keeps it."""


Convert = Callable[[Any], Any]


def _anchor(pattern: str) -> str:
    # pydantic's (Rust) `$` means end of text; Python's also matches before a final newline.
    return pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith(r"\$") \
        else pattern


def _meta(constraints: list[Any], base: Any) -> msgspec.Meta | None:
    kw: dict[str, Any] = {}
    finite = False
    for c in constraints:
        if isinstance(c, FieldInfo):
            for inner in c.metadata:
                constraints.append(inner)
            continue
        if isinstance(c, at.Ge):
            kw["ge"] = c.ge
        elif isinstance(c, at.Gt):
            kw["gt"] = c.gt
        elif isinstance(c, at.Le):
            kw["le"] = c.le
        elif isinstance(c, at.Lt):
            kw["lt"] = c.lt
        elif isinstance(c, at.MinLen):
            kw["min_length"] = c.min_length
        elif isinstance(c, at.MaxLen):
            kw["max_length"] = c.max_length
        elif type(c).__name__ == "AllowInfNan":
            finite = finite or c.allow_inf_nan is False
        elif type(c).__name__ == "_PydanticGeneralMetadata":
            for key, value in vars(c).items():
                if key == "pattern":
                    kw["pattern"] = _anchor(value if isinstance(value, str) else value.pattern)
                elif key == "allow_inf_nan":
                    finite = value is False
                else:
                    raise Unsupported(f"constraint {key}")
        else:
            raise Unsupported(f"constraint {c!r}")
    if base is float or finite:
        # msgspec refuses out-of-range numbers and JSON has no NaN; keep every float finite
        # either way (pydantic's JSON reader admits inf/nan only as strings, refused here).
        if "gt" not in kw:
            kw.setdefault("ge", -_FLOAT_MAX)
        if "lt" not in kw:
            kw.setdefault("le", _FLOAT_MAX)
    return msgspec.Meta(**kw) if kw else None


class _Builder:
    """Translates one model tree; remembers each Struct's converter to pydantic."""

    def __init__(self) -> None:
        self.structs: dict[type[BaseModel], type[msgspec.Struct]] = {}
        self.converters: dict[type[msgspec.Struct], Convert] = {}

    def typ(self, tp: Any) -> tuple[Any, Convert | None]:
        """The msgspec type for ``tp`` and how to turn its decoded value into pydantic's."""
        origin = get_origin(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            struct = self.struct(tp)
            return struct, self.converters[struct]
        if origin is Annotated:
            base, *extra = get_args(tp)
            inner, conv = (float, None) if base is float else self.typ(base)
            meta = _meta(list(extra), base)
            return (Annotated[inner, meta] if meta else inner), conv
        if origin in (Union, types.UnionType):
            parts = [self.typ(a) for a in get_args(tp)]
            if any(c is not None for _, c in parts):
                convs = [c for _, c in parts if c is not None]
                if len(convs) > 1:
                    raise Unsupported("union of several models")
                one = convs[0]

                def conv_opt(v: Any) -> Any:
                    return one(v) if isinstance(v, msgspec.Struct) else v
                return Union[tuple(t for t, _ in parts)], conv_opt  # noqa: UP007
            return Union[tuple(t for t, _ in parts)], None  # noqa: UP007
        if origin is list:
            (item,) = get_args(tp)
            inner, conv = self.typ(item)
            if conv is None:
                return list[inner], None  # type: ignore[valid-type]
            item_conv = conv
            return list[inner], lambda v: [item_conv(x) for x in v]  # type: ignore[valid-type]
        if origin is dict:
            key, value = get_args(tp)
            k, kc = self.typ(key)
            v, vc = self.typ(value)
            if kc is not None or vc is not None:
                raise Unsupported("dict of models")
            return dict[k, v], None  # type: ignore[valid-type]
        if origin is Literal:
            return tp, None
        if tp is float:
            return Annotated[float, _meta([], float)], None
        if tp in (str, int, bool, type(None)):
            return tp, None
        if isinstance(tp, type) and issubclass(tp, Enum):
            return tp, None
        raise Unsupported(f"type {tp!r}")

    def struct(self, model: type[BaseModel], *, tag: str | None = None,
               overrides: dict[str, Any] | None = None) -> type[msgspec.Struct]:
        if tag is None and model in self.structs:
            return self.structs[model]
        dec = model.__pydantic_decorators__
        if (dec.model_validators or dec.field_validators or dec.validators
                or dec.root_validators):
            raise Unsupported(f"{model.__name__} has validators")
        if model.model_config.get("extra") != "forbid":
            raise Unsupported(f"{model.__name__} admits extra fields")
        fields: list[tuple[str, Any, Any]] = []
        nested: list[tuple[str, Convert]] = []
        factories: list[tuple[str, Callable[[], Any]]] = []
        for name, info in model.model_fields.items():
            if info.alias not in (None, name):
                raise Unsupported(f"{model.__name__}.{name} has an alias")
            if tag is not None and name == "type":
                continue  # the tag: msgspec checks it, the converter writes it back
            if overrides and name in overrides:
                fields.append((name, overrides[name], msgspec.NODEFAULT))
                continue
            annotation: Any = info.annotation
            if info.metadata:
                args = (annotation, *info.metadata)
                annotation = Annotated[args]
            tp, conv = self.typ(annotation)
            if conv is not None and not isinstance(info.default, BaseModel):
                nested.append((name, conv))
            if info.default_factory is not None:
                factory = typing.cast(Callable[[], Any], info.default_factory)
                default: Any = msgspec.field(default_factory=factory)
                factories.append((name, factory))
            elif info.is_required():
                default = msgspec.NODEFAULT
            elif isinstance(info.default, BaseModel):
                default = msgspec.field(default=None)  # filled in below from the model
                model_default = info.default
                nested.append((name, _keep_default(conv, model_default)))
            else:
                default = info.default
            fields.append((name, tp, default))
        struct = msgspec.defstruct(
            f"Fast{model.__name__}" + (f"_{re.sub(r'[^A-Za-z0-9]', '_', tag)}" if tag else ""),
            fields, kw_only=True, forbid_unknown_fields=True,
            tag_field="type" if tag else None, tag=tag, frozen=False,
        )
        self.converters[struct] = _converter(model, nested)
        if tag is None:
            self.structs[model] = struct
        return struct


def _keep_default(conv: Convert | None, default: BaseModel) -> Convert:
    def convert(v: Any) -> Any:
        if v is None:
            return default
        return conv(v) if conv is not None else v
    return convert


_SET_DICT = object.__setattr__
_SET_FIELDS_SET = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_SET_EXTRA = BaseModel.__dict__["__pydantic_extra__"].__set__
_SET_PRIVATE = BaseModel.__dict__["__pydantic_private__"].__set__


def _converter(model: type[BaseModel], nested: list[tuple[str, Convert]]) -> Convert:
    """Struct -> pydantic instance, no second validation (what ``model_construct`` does,
    without re-reading defaults: msgspec already filled them in). The hottest loop of the
    decoder: one C ``asdict``, the nested models, four slot writes."""
    asdict = msgspec.structs.asdict
    new = model.__new__
    # One set shared by every instance: frozen models never change it, and pydantic's
    # model_copy copies it before an update.
    names = set(model.model_fields)
    set_dict, set_fields, set_extra, set_private = (
        _SET_DICT, _SET_FIELDS_SET, _SET_EXTRA, _SET_PRIVATE)

    def convert(s: Any) -> Any:
        values = asdict(s)
        for name, conv in nested:
            values[name] = conv(values[name])
        inst = new(model)
        set_dict(inst, "__dict__", values)
        set_fields(inst, names)
        set_extra(inst, None)
        set_private(inst, None)
        return inst

    def convert_flat(s: Any) -> Any:
        inst = new(model)
        set_dict(inst, "__dict__", asdict(s))
        set_fields(inst, names)
        set_extra(inst, None)
        set_private(inst, None)
        return inst
    return convert if nested else convert_flat


def _event_struct(builder: _Builder, spec: EventType, typed: type[Event]) -> type[msgspec.Struct]:
    payload_struct = builder.struct(spec.payload)
    return builder.struct(
        typed, tag=spec.name,
        overrides={"schema_version": Literal[spec.version],
                   "payload": payload_struct},
    )


def build(typed_events: dict[str, type[Event]]) -> tuple[msgspec.json.Decoder[Any],
                                                         dict[type[msgspec.Struct], Convert],
                                                         frozenset[str]]:
    builder = _Builder()
    builder.struct(Subject)
    tops: list[type[msgspec.Struct]] = []
    converters: dict[type[msgspec.Struct], Convert] = {}
    fast: set[str] = set()
    for name, spec in BY_NAME.items():
        try:
            top = _event_struct(builder, spec, typed_events[name])
        except Unsupported:
            continue
        # The tag field is consumed by msgspec; the payload needs its own conversion.
        payload_conv = builder.converters[builder.structs[spec.payload]]
        event_conv = _with_payload(builder.converters[top], payload_conv, name,
                                   tuple(typed_events[name].model_fields))
        converters[top] = event_conv
        tops.append(top)
        fast.add(name)
    decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(
        Union[tuple(tops)] if tops else None)  # noqa: UP007 - built from the registry
    return decoder, converters, frozenset(fast)


def _with_payload(conv: Convert, payload_conv: Convert, type_name: str,
                  order: tuple[str, ...]) -> Convert:
    """The event converter: its payload converted, ``type`` (the tag) written back, the fields
    in the model's order (``encode`` then writes the same bytes as for a validated event)."""
    def convert(s: Any) -> Any:
        event = conv(s)
        values = event.__dict__
        values["type"] = type_name
        values["payload"] = payload_conv(values["payload"])
        object.__setattr__(event, "__dict__", {k: values[k] for k in order})
        return event
    return convert


DECODER, CONVERT, FAST_TYPES = build(codec.TYPED_EVENTS)


def decode_struct(raw: bytes) -> msgspec.Struct:
    """The record as compiled Structs, strictly validated; ``ContractError`` when the gate
    refuses it (which may still be a valid event for ``codec.decode``: lax or old input)."""
    try:
        struct: msgspec.Struct = DECODER.decode(raw)
    except Exception as exc:  # msgspec's errors, and e.g. UnicodeDecodeError on a bad key
        raise ContractError([FieldError("<record>", raw[:64], f"refused by the gate: {exc}")]
                            ) from None
    return struct


def to_event(struct: msgspec.Struct) -> Event:
    """The pydantic event for a Struct the gate accepted (no second validation)."""
    event: Event = CONVERT[type(struct)](struct)
    return event


def decode_fast(raw: bytes) -> Event:
    """``codec.decode`` with the gate in front: the same events and the same errors."""
    try:
        struct = DECODER.decode(raw)
    except Exception:  # refused by the gate (or it failed): pydantic judges, and names why
        return codec.decode(raw)
    event = to_event(struct)
    codec.check_subject(event)
    return event
