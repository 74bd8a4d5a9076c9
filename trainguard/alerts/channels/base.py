"""The one thing a channel does: build the HTTP request for a message, at a given time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from trainguard.alerts.ratelimit import Limit
from trainguard.alerts.render import Message
from trainguard.alerts.reply import ReplyCheck

JSON_HEADERS = {"Content-Type": "application/json; charset=utf-8"}
HTTP_ONLY = ReplyCheck()  # any 2xx is delivered


@dataclass(frozen=True)
class HttpRequest:
    url: str  # may carry the token: never logged; ``shown`` is what logs and errors print
    body: bytes
    shown: str
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON_HEADERS))
    check: ReplyCheck = HTTP_ONLY


@dataclass(frozen=True)
class ChannelPolicy:
    name: str
    kind: str
    limits: tuple[Limit, ...]
    max_individual: int = 5  # more notices due at once than this: one digest message
    resend_s: float | None = None  # re-send what is still firing this often (Alertmanager)


class Channel(Protocol):
    @property
    def policy(self) -> ChannelPolicy: ...

    def build(self, message: Message, now_s: float) -> HttpRequest:
        """The request that posts ``message``; ``now_s`` (Unix seconds) for signatures."""
        ...
