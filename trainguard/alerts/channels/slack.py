"""Slack incoming webhook: ``{"text": mrkdwn}``; answers the plain text ``ok``.

Incoming webhooks cannot thread: Slack answers ``ok``, not a ``ts`` to reply to. Every message
about one incident starts with the same title (``trainguard · <job> · INC-<id>``) and ends
with its thread key, so the channel's search shows an incident's thread. About one message
per second per webhook (short bursts allowed; 429 with Retry-After beyond that).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from trainguard.alerts.channels.base import ChannelPolicy, HttpRequest
from trainguard.alerts.ratelimit import Limit
from trainguard.alerts.render import Message, body_lines, title, truncate_utf8
from trainguard.alerts.reply import ReplyCheck
from trainguard.alerts.secrets import Secret, shown_url
from trainguard.text import escape

SLACK_LIMITS = (Limit(1, 1.0),)
MAX_TEXT_BYTES = 39_000


@dataclass(frozen=True)
class SlackChannel:
    name: str
    url: Secret
    limits: tuple[Limit, ...] = SLACK_LIMITS
    max_individual: int = 5

    @property
    def policy(self) -> ChannelPolicy:
        return ChannelPolicy(self.name, "slack", self.limits, self.max_individual)

    def build(self, message: Message, now_s: float) -> HttpRequest:
        esc = escape.slack  # a node named <!channel> must not ping the channel
        text = "\n".join([f"*{title(message, esc)}*", *body_lines(message, esc)])
        body = {"text": truncate_utf8(text, MAX_TEXT_BYTES), "unfurl_links": False,
                "unfurl_media": False}
        return HttpRequest(url=self.url.reveal(), body=json.dumps(body).encode(),
                           shown=shown_url(self.url.reveal()), check=ReplyCheck(ok_text="ok"))
