"""WeCom (WeChat Work) group robot: markdown (at most 4096 bytes) or text (2048 bytes); the
``key`` in the URL is the credential. Answers ``{"errcode": 0}``; 45009 means too fast.
20 messages per minute per robot."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from trainguard.alerts.channels.base import ChannelPolicy, HttpRequest
from trainguard.alerts.ratelimit import Limit
from trainguard.alerts.render import Message, markdown, plain_text, truncate_utf8
from trainguard.alerts.reply import ReplyCheck
from trainguard.alerts.secrets import Secret, shown_url

WECOM_LIMITS = (Limit(20, 60.0),)
WECOM_REPLY = ReplyCheck(code_keys=("errcode",), retry_codes=frozenset({-1, 45009}))
MAX_MARKDOWN_BYTES = 4096
MAX_TEXT_BYTES = 2048


@dataclass(frozen=True)
class WeComChannel:
    name: str
    url: Secret
    msgtype: Literal["markdown", "text"] = "markdown"
    limits: tuple[Limit, ...] = WECOM_LIMITS
    max_individual: int = 5

    @property
    def policy(self) -> ChannelPolicy:
        return ChannelPolicy(self.name, "wecom", self.limits, self.max_individual)

    def build(self, message: Message, now_s: float) -> HttpRequest:
        body: dict[str, Any]
        if self.msgtype == "markdown":
            body = {"msgtype": "markdown",
                    "markdown": {"content": truncate_utf8(markdown(message),
                                                          MAX_MARKDOWN_BYTES)}}
        else:
            body = {"msgtype": "text",
                    "text": {"content": truncate_utf8(plain_text(message), MAX_TEXT_BYTES)}}
        return HttpRequest(url=self.url.reveal(), body=json.dumps(body).encode(),
                           shown=shown_url(self.url.reveal()), check=WECOM_REPLY)
