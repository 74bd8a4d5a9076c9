"""Feishu/Lark custom bot: a ``post`` (title + lines), signed with ``timestamp`` and ``sign`` in
the body when the bot has a secret. Answers ``{"code": 0}`` (older: ``{"StatusCode": 0}``);
code 9499/11232 mean too many requests. 5 per second and 100 per minute per bot.

Links (Grafana, the timeline) are a line of ``a`` tags; mentions a line of ``at`` tags
(``user_id``: an open_id/user_id, or ``all``)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trainguard.alerts.channels.base import ChannelPolicy, HttpRequest
from trainguard.alerts.links import NO_LINKS, Links
from trainguard.alerts.mentions import Mention, Mentions
from trainguard.alerts.ratelimit import Limit
from trainguard.alerts.render import Message, body_lines, title
from trainguard.alerts.reply import ReplyCheck
from trainguard.alerts.secrets import Secret, shown_url
from trainguard.alerts.signing import feishu_sign
from trainguard.text import escape

FEISHU_LIMITS = (Limit(5, 1.0), Limit(100, 60.0))
FEISHU_REPLY = ReplyCheck(code_keys=("code", "StatusCode"), retry_codes=frozenset({9499, 11232}))


def at_tags(who: Mention) -> list[dict[str, str]]:
    ids = [*who.user_ids, *(["all"] if who.all else [])]
    return [{"tag": "at", "user_id": uid} for uid in ids]


@dataclass(frozen=True)
class FeishuChannel:
    name: str
    url: Secret
    secret: Secret | None = None
    limits: tuple[Limit, ...] = FEISHU_LIMITS
    max_individual: int = 5
    links: Links = NO_LINKS
    mentions: Mentions = field(default_factory=Mentions)

    @property
    def policy(self) -> ChannelPolicy:
        return ChannelPolicy(self.name, "feishu", self.limits, self.max_individual)

    def build(self, message: Message, now_s: float) -> HttpRequest:
        body: dict[str, Any] = {}
        if self.secret is not None:
            ts = int(now_s)
            body["timestamp"] = str(ts)
            body["sign"] = feishu_sign(ts, self.secret.reveal())
        content: list[list[dict[str, str]]] = [
            [{"tag": "text", "text": line}] for line in body_lines(message, escape.feishu)]
        links = self.links.for_message(message, now_s)
        if links:
            content.append([{"tag": "a", "text": link.label + " ", "href": link.url}
                            for link in links])
        mention = at_tags(self.mentions.for_message(message))
        if mention:
            content.append(mention)
        body["msg_type"] = "post"
        body["content"] = {"post": {"zh_cn": {
            "title": title(message, escape.feishu), "content": content}}}
        return HttpRequest(url=self.url.reveal(), body=json.dumps(body).encode(),
                           shown=shown_url(self.url.reveal()), check=FEISHU_REPLY)
