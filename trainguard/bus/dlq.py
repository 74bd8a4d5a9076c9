"""Dead letters: a refused record kept whole, with why it was refused."""

from __future__ import annotations

import base64
from dataclasses import asdict, dataclass

import orjson

from trainguard.events.errors import ContractError, short_repr


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
    def decode(cls, raw: bytes) -> DeadLetter:
        return cls(**orjson.loads(raw))

    def original_value(self) -> bytes:
        return base64.b64decode(self.value_b64)


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
