"""Render the contract (docs/events.md) from the registry, so the two cannot drift apart."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from trainguard.events import payloads as p
from trainguard.events.envelope import Header, Subject
from trainguard.events.registry import EVENT_TYPES, UPCASTERS
from trainguard.events.topics import TOPIC_SPECS, TopicNames

_INTRO = """\
# The trainguard event contract

Generated from `trainguard/events/registry.py` by `trainguard events schema --markdown`;
`tests/unit/test_contract_docs.py` fails when this file and the code disagree.

Every event is one JSON object: the **envelope** below with a typed **payload**. Times are
integer microseconds since the Unix epoch (UTC); durations are float milliseconds. A value a
source cannot measure is absent (null), never a sentinel. Records that fail validation are
not dropped: they go to the dead-letter topic with the field, the value and the reason, and the
consumer carries on with the records around them.

Versioning: changes are additive within a version (new optional fields). A change that
needs a reader to transform old records bumps `schema_version` and ships an upcaster; readers
refuse versions newer than they know.

Signatures: a type with a signer (column *signed by*) carries an Ed25519 signature in its
payload's `signature` field (`ed25519:<key id>:<128 hex>`, see `trainguard/actuators/signing.py`
and docs/security.md). A reader that believes such a type checks it against the keys
configured to it; a record that does not verify is dead-lettered with the reason, never folded.
"""


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is typing.Literal:
        return " \\| ".join(repr(a) for a in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", str(annotation))


def _required(info: FieldInfo) -> str:
    return "yes" if info.is_required() else "no"


def _fields_table(model: type[BaseModel]) -> list[str]:
    rows = ["| field | type | required |", "|---|---|---|"]
    for name, info in model.model_fields.items():
        if info.exclude:  # a params/data model's hidden action key: never on the wire
            continue
        rows.append(f"| `{name}` | {_type_name(info.annotation)} | {_required(info)} |")
    return rows


def _nested_models(model: type[BaseModel]) -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []

    def walk(annotation: Any) -> None:
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation not in found:
                found.append(annotation)
                for info in annotation.model_fields.values():
                    walk(info.annotation)
            return
        for arg in typing.get_args(annotation):
            walk(arg)

    for info in model.model_fields.values():
        walk(info.annotation)
    return found


def _vocabulary(model: type[BaseModel]) -> list[str]:
    """The typed vocabulary a payload's fields are keyed by."""
    if model is p.Verdict:
        return ["", "Verdict kinds and their class (what the policy does with an open one: "
                "`failure` restarts around the rank at once, `ladder` climbs the tiers, `info` "
                "is recorded only):", "", "| kind | class |", "|---|---|",
                *(f"| `{k.value}` | {k.verdict_class.value} |" for k in p.VerdictKind)]
    by_model: dict[type[BaseModel], tuple[str, Mapping[p.CommandAction, type[BaseModel]]]] = {
        p.Command: ("params", p.COMMAND_PARAMS), p.CommandOutcome: ("data", p.OUTCOME_DATA)}
    keyed = by_model.get(model)
    if keyed is None:
        return []
    field, by_action = keyed
    return ["", f"`{field}` is the model of the `action` (absent: that model's defaults):", "",
            f"| action | `{field}` |", "|---|---|",
            *(f"| `{a.value}` | {m.__name__} |" for a, m in by_action.items())]


def render_markdown(names: TopicNames | None = None) -> str:
    names = names or TopicNames()
    out = [_INTRO, "## Event types", "",
           "| type | version | topic | key | signed by | meaning |", "|---|---|---|---|---|---|"]
    for t in EVENT_TYPES:
        signer = t.signed_by.value if t.signed_by is not None else "-"
        topics = " + copy on ".join(f"`{names.name(r)}`" for r in t.topics)
        out.append(f"| `{t.name}` | {t.version} | {topics} | {t.key_by} | "
                   f"{signer} | {t.summary} |")
    out += ["", "## Topics", "", "| topic | partitions | key | retention | meaning |",
            "|---|---|---|---|---|"]
    for s in TOPIC_SPECS:
        retention = "forever" if s.retention_ms < 0 else f"{s.retention_ms} ms"
        out.append(f"| `{names.name(s.role)}` | {s.partitions} | {s.key} | {retention}, "
                   f"{s.cleanup_policy} | {s.description} |")
    out += ["", "## Envelope", "", *_fields_table(Header), "| `payload` | object | yes |", "",
            "### Subject", "", *_fields_table(Subject), ""]
    for t in EVENT_TYPES:
        out += [f"## `{t.name}` (v{t.version}) — {t.payload.__name__}", "", t.summary, ""]
        if t.signed_by is not None:
            out += [f"Signed by: {t.signed_by.value} (`payload.signature`).", ""]
        if t.requires_subject:
            out += ["Subject must carry: " + ", ".join(f"`{f}`" for f in t.requires_subject), ""]
        out += _fields_table(t.payload)
        out += _vocabulary(t.payload)
        for nested in _nested_models(t.payload):
            out += ["", f"### {nested.__name__}", "", *_fields_table(nested)]
        ups = [v for (name, v) in UPCASTERS if name == t.name]
        if ups:
            out += ["", "Upcasters: " + ", ".join(f"v{v} → v{v + 1}" for v in sorted(ups))]
        out.append("")
    out += ["## Dead letters", "",
            "A record refused at the edge is written to the dead-letter topic as a JSON object "
            "(not an envelope: it may not be one) — see `trainguard/bus/dlq.py`:", "",
            "| field | meaning |", "|---|---|",
            "| `reason` | every field error, `field: reason (got value)`, joined by `; ` |",
            "| `field` | the first bad field's dotted path (`payload.compute_ms`); `<record>` "
            "when the record is no event at all (a null value or tombstone, bytes that are not "
            "JSON, a JSON value that is not an object); `<handler>` when the record decoded "
            "but handling it raised (the reason names the exception) |",
            "| `value` | repr of the first bad value (truncated to 200 chars) |",
            "| `source_topic`, `source_partition`, `source_offset` | where the record was read |",
            "| `key_b64`, `value_b64` | the original key and value bytes, base64 |",
            "| `rejected_at` | microseconds since the epoch when it was refused |",
            "| `consumer` | the service that refused it |", "",
            "The consumer commits past a dead-lettered record and carries on: no record stops "
            "a consumer, and a restart does not read it again (consumers without a group, "
            "which re-read the log at each start, write its letter again). Read-only tools "
            "(`incident list`/`show`, `replay`, `metrics serve`) skip and count such records "
            "instead.", ""]
    return "\n".join(out)
