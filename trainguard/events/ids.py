"""Event identifiers: random for observations, derived for decisions so replays dedupe."""

from __future__ import annotations

import hashlib
import uuid


def new_event_id() -> str:
    """A fresh unique id for an observation made once (a sample, a report)."""
    return uuid.uuid4().hex


def derived_id(namespace: str, *parts: object) -> str:
    """A deterministic id from a namespace and the inputs that define the thing.

    The same rule on the same inputs gives the same id in live processing and in replay, so
    duplicates collapse. Parts are joined unambiguously (length-prefixed) before hashing.
    """
    h = hashlib.sha256()
    for piece in (namespace, *parts):
        data = str(piece).encode()
        h.update(len(data).to_bytes(4, "big"))
        h.update(data)
    return h.hexdigest()[:32]
