"""Dead letters: a refused record kept whole, with why it was refused.

A record is refused when it is not an event (``codec.decode`` raised ``ContractError``: a null
value or tombstone, bad bytes, not JSON, a bad field) or when handling it raised (``refusal``
turns that exception into the reason). Either way the consumer writes the letter, commits past
the record and carries on: no record can stop a consumer, now or after a restart.
"""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass

import orjson

from trainguard.events.errors import ContractError, FieldError, short_repr


@dataclass(frozen=True)
class DeadLetter:
    reason: str
    field: str
    value: str
    source_topic: str
    source_partition: int
    source_offset: int
    key_b64: str | None
    value_b64: str
    rejected_at: int
    consumer: str

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, raw: bytes | None) -> DeadLetter:
        """The letter in ``raw``; ``ValueError`` for anything else (a null value too)."""
        if raw is None:
            raise ValueError("a null value is not a dead letter")
        doc = orjson.loads(raw)
        if not isinstance(doc, dict) or set(doc) != _FIELDS:
            raise ValueError("not a dead letter: its fields are " + ", ".join(sorted(_FIELDS)))
        for name, kind in _KINDS.items():
            value = doc[name]
            if not (isinstance(value, kind) and not isinstance(value, bool)) and not (
                    value is None and name == "key_b64"):
                raise ValueError(f"dead letter field {name}: {value!r} is not {kind.__name__}")
        return cls(**doc)

    def original_value(self) -> bytes:
        return base64.b64decode(self.value_b64)


_KINDS: dict[str, type] = {"reason": str, "field": str, "value": str, "source_topic": str,
                          "source_partition": int, "source_offset": int, "key_b64": str,
                          "value_b64": str, "rejected_at": int, "consumer": str}
_FIELDS = frozenset(_KINDS)


def refusal(exc: BaseException) -> ContractError:
    """The reason a record is refused when handling it raised ``exc``: a ``ContractError``
    as it is, anything else named by its type and message under the field ``<handler>``."""
    if isinstance(exc, ContractError):
        return exc
    return ContractError([FieldError("<handler>", type(exc).__name__,
                                     f"handling it raised {type(exc).__name__}: {exc}")])


def dead_letter(
    error: ContractError,
    *,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes,
    rejected_at: int,
    consumer: str,
) -> DeadLetter:
    first = error.first
    return DeadLetter(
        reason=str(error),
        field=first.field,
        value=short_repr(first.value),
        source_topic=topic,
        source_partition=partition,
        source_offset=offset,
        key_b64=base64.b64encode(key).decode() if key is not None else None,
        value_b64=base64.b64encode(value).decode(),
        rejected_at=rejected_at,
        consumer=consumer,
    )
