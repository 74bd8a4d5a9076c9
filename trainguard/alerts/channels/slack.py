"""Slack incoming webhook: Block Kit (header, section, context, actions with link buttons)
plus ``text``, the mrkdwn fallback Slack shows in notifications; answers the plain text ``ok``.

- header: the title as ``plain_text`` (never parsed: no mention or link can form), at most
  150 characters;
- section (mrkdwn): the configured mentions for the severity, then the body lines with user
  text ``escape.slack``-ed (``<!channel>`` in a node name stays text), at most 3000 characters;
- context: severity, verdict kind and the thread key;
- actions: one button per link (Grafana over the incident's range, the served timeline).

Incoming webhooks cannot thread: Slack answers ``ok``, not a ``ts`` to reply to. Every message
about one incident starts with the same title (``trainguard · <job> · INC-<id>``) and ends
with its thread key, so the channel's search shows an incident's thread. About one message
per second per webhook (short bursts allowed; 429 with Retry-After beyond that).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trainguard.alerts.channels.base import ChannelPolicy, HttpRequest
from trainguard.alerts.links import NO_LINKS, Link, Links
from trainguard.alerts.mentions import Mentions, slack_text
from trainguard.alerts.ratelimit import Limit
from trainguard.alerts.render import Message, body_lines, title, truncate_utf8
from trainguard.alerts.reply import ReplyCheck
from trainguard.alerts.secrets import Secret, shown_url
from trainguard.text import escape

SLACK_LIMITS = (Limit(1, 1.0),)
MAX_TEXT_BYTES = 39_000
MAX_HEADER_CHARS = 150  # Block Kit's limits
MAX_SECTION_CHARS = 3000
MAX_URL_CHARS = 3000


def cut(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max_chars - 4] + " ..."


def context_text(message: Message) -> str:
    esc = escape.slack
    if message.digest:
        return f"{len({n.incident_id for n in message.notices})} incidents"
    n = message.notices[0]
    parts = [f"severity: {n.severity.value if n.severity else 'unknown'}"]
    if n.verdict_kind is not None:
        parts.append(f"verdict: {n.verdict_kind.value}")
    parts.append(f"thread: {esc(n.thread_key)}")
    return " · ".join(parts)


def button(link: Link, i: int) -> dict[str, Any]:
    return {"type": "button", "action_id": f"link-{i}", "url": link.url,
            "text": {"type": "plain_text", "text": link.label}}


def blocks(message: Message, mention: str, links: list[Link]) -> list[dict[str, Any]]:
    esc = escape.slack  # a node named <!channel> must not ping the channel
    lines = ([mention] if mention else []) + body_lines(message, esc)
    out: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "emoji": False,
                                    "text": cut(title(message), MAX_HEADER_CHARS)}},
        {"type": "section", "text": {"type": "mrkdwn",
                                     "text": cut("\n".join(lines), MAX_SECTION_CHARS)}},
        {"type": "context", "elements": [{"type": "mrkdwn", "text": context_text(message)}]},
    ]
    usable = [link for link in links if len(link.url) <= MAX_URL_CHARS]
    if usable:
        out.append({"type": "actions",
                    "elements": [button(link, i) for i, link in enumerate(usable)]})
    return out


@dataclass(frozen=True)
class SlackChannel:
    name: str
    url: Secret
    limits: tuple[Limit, ...] = SLACK_LIMITS
    max_individual: int = 5
    links: Links = NO_LINKS
    mentions: Mentions = field(default_factory=Mentions)

    @property
    def policy(self) -> ChannelPolicy:
        return ChannelPolicy(self.name, "slack", self.limits, self.max_individual)

    def build(self, message: Message, now_s: float) -> HttpRequest:
        esc = escape.slack
        mention = slack_text(self.mentions.for_message(message))
        links = self.links.for_message(message, now_s)
        fallback = [f"*{title(message, esc)}*", *body_lines(message, esc)]
        fallback += [f"<{link.url}|{link.label}>" for link in links]
        if mention:
            fallback.append(mention)
        body = {"text": truncate_utf8("\n".join(fallback), MAX_TEXT_BYTES),
                "blocks": blocks(message, mention, links),
                "unfurl_links": False, "unfurl_media": False}
        return HttpRequest(url=self.url.reveal(), body=json.dumps(body).encode(),
                           shown=shown_url(self.url.reveal()), check=ReplyCheck(ok_text="ok"))
