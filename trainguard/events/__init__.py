"""The event contract: envelope, typed payloads, registry, codec. See docs/events.md."""

from trainguard.events.codec import decode, encode, make_event, partition_key
from trainguard.events.envelope import Event, Subject
from trainguard.events.errors import ContractError, FieldError

__all__ = [
    "ContractError",
    "Event",
    "FieldError",
    "Subject",
    "decode",
    "encode",
    "make_event",
    "partition_key",
]
