"""Bytes <-> events. JSON on the wire, validated against the registry on the way in.

``encode`` is deterministic: the same event always gives the same bytes, which is what makes
replayed verdict sequences byte-identical. ``decode`` raises ``ContractError`` naming every bad
field with its value; callers at the edge turn that into a dead letter (``bus/dlq.py``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import orjson
from pydantic import Field, TypeAdapter, ValidationError, create_model

from trainguard.events.envelope import Event, Header, Subject
from trainguard.events.errors import ContractError, FieldError
from trainguard.events.payloads import Payload
from trainguard.events.registry import BY_NAME, EventType, upcast


def _typed_event(spec: EventType) -> type[Event]:
    """An Event subclass whose payload is the type's own model: one validation pass in Rust."""
    model: type[Event] = create_model(
        "".join(part.capitalize() for part in spec.name.replace(".", "_").split("_")) + "Event",
        __base__=Event,
        type=(Literal[spec.name], ...),  # type: ignore[arg-type]
        payload=(spec.payload, ...),
    )
    return model


TYPED_EVENTS: dict[str, type[Event]] = {spec.name: _typed_event(spec) for spec in BY_NAME.values()}
# Fast path for current-version records: the discriminated union validates straight from bytes.
_UNION: Any = Union[tuple(TYPED_EVENTS.values())]  # noqa: UP007 - built from the registry
_ANY_EVENT: TypeAdapter[Event] = TypeAdapter(Annotated[_UNION, Field(discriminator="type")])


def encode(event: Event) -> bytes:
    return event.model_dump_json(exclude_none=True).encode()


def make_event(
    payload: Payload,
    *,
    event_id: str,
    job_id: str,
    event_time: int,
    source: str,
    subject: Subject | None = None,
    ingest_time: int | None = None,
) -> Event:
    """Build a validated event around a payload; the type comes from the payload's class."""
    spec = type_of_payload(type(payload))
    fields: dict[str, Any] = {
        "event_id": event_id,
        "type": spec.name,
        "schema_version": spec.version,
        "job_id": job_id,
        "subject": subject or Subject(),
        "event_time": event_time,
        "ingest_time": ingest_time,
        "source": source,
        "payload": payload,
    }
    try:
        event = TYPED_EVENTS[spec.name](**fields)
    except ValidationError as exc:
        raise ContractError(_field_errors(exc, prefix="")) from None
    _check_subject(event, spec)
    return event


def type_of_payload(model: type[Payload]) -> EventType:
    for spec in BY_NAME.values():
        if spec.payload is model:
            return spec
    raise KeyError(f"{model.__name__} is not a registered payload")


def decode(raw: bytes | bytearray | memoryview | None) -> Event:
    """The event in ``raw``, or ``ContractError``, whatever the bytes (or a null value: a
    tombstone). Nothing else escapes: a record is never a poison pill for its consumer."""
    if raw is None:
        raise ContractError([FieldError("<record>", None,
                                        "null value (a tombstone), not an event")])
    if not isinstance(raw, bytes | bytearray | memoryview):
        raise ContractError([FieldError("<record>", type(raw).__name__,
                                        "a record value is bytes")])
    try:
        return _decode(bytes(raw))
    except ContractError:
        raise
    except Exception as exc:  # any other failure is this record's fault too
        raise ContractError([FieldError("<record>", bytes(raw[:64]),
                                        f"undecodable: {type(exc).__name__}: {exc}")]) from None


def _decode(raw: bytes) -> Event:
    try:
        event = _ANY_EVENT.validate_json(raw)
    except ValueError:
        pass  # old version, unknown type, or bad: the careful path names what is wrong
    else:
        spec = BY_NAME[event.type]
        if event.schema_version == spec.version:
            _check_subject(event, spec)
            return event
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ContractError([FieldError("<record>", raw[:64], f"not JSON: {exc}")]) from None
    if not isinstance(doc, dict):
        raise ContractError([FieldError("<record>", doc, "an event is a JSON object")])
    return decode_obj(doc)


def decode_obj(doc: dict[str, Any]) -> Event:
    doc = dict(doc)
    payload_doc = doc.pop("payload", None)
    try:
        header = Header.model_validate(doc)
    except ValidationError as exc:
        raise ContractError(_field_errors(exc, prefix="")) from None
    spec = BY_NAME.get(header.type)
    if spec is None:
        known = ", ".join(sorted(BY_NAME))
        raise ContractError(
            [FieldError("type", header.type, f"unknown event type (known: {known})")])
    if header.schema_version > spec.version:
        raise ContractError([FieldError(
            "schema_version", header.schema_version,
            f"newer than this reader knows for {spec.name} (max {spec.version})")])
    if not isinstance(payload_doc, dict):
        raise ContractError([FieldError("payload", payload_doc, "payload must be a JSON object")])
    payload_doc = upcast(spec.name, header.schema_version, payload_doc)
    try:
        payload = spec.payload.model_validate(payload_doc)
    except ValidationError as exc:
        raise ContractError(_field_errors(exc, prefix="payload.")) from None
    event = TYPED_EVENTS[spec.name].model_construct(
        **{**header.__dict__, "schema_version": spec.version, "payload": payload}
    )
    _check_subject(event, spec)
    return event


def check_subject(event: Event) -> None:
    """The subject fields the event's type requires are there (``ContractError`` if not)."""
    _check_subject(event, BY_NAME[event.type])


def _check_subject(event: Event, spec: EventType) -> None:
    missing = [f for f in spec.requires_subject if getattr(event.subject, f) is None]
    if missing:
        raise ContractError([
            FieldError(f"subject.{f}", None, f"required for {spec.name}") for f in missing
        ])


def _field_errors(exc: ValidationError, prefix: str) -> list[FieldError]:
    out: list[FieldError] = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(part) for part in err["loc"]) or "<root>"
        out.append(FieldError(prefix + loc, err.get("input"), err["msg"]))
    return out


def partition_key(event: Event) -> bytes:
    """The Kafka key: the job id, for every topic. A job's telemetry and its task events then
    sit on the same partition number of their topics (equal partition counts), so one streams
    worker sees all of a job without re-keying; node-level records outside any job are filed
    under ``node:<node>`` and spread by node."""
    return event.job_id.encode()
