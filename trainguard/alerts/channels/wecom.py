"""WeCom (WeChat Work) group robot: markdown (at most 4096 bytes) or text (2048 bytes); the
``key`` in the URL is the credential. Answers ``{"errcode": 0}``; 45009 means too fast.
20 messages per minute per robot.

Links (Grafana, the timeline) are Markdown links on the last line (``label: URL`` in text).
Mentions: ``text`` messages carry ``mentioned_list`` (user ids, ``@all``) and
``mentioned_mobile_list``; ``markdown`` messages can only mention by user id, as ``<@id>`` in
the content (the config refuses mobiles and ``all`` with markdown)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from trainguard.alerts.channels.base import ChannelPolicy, HttpRequest
from trainguard.alerts.links import NO_LINKS, Links
from trainguard.alerts.mentions import Mentions
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
    links: Links = NO_LINKS
    mentions: Mentions = field(default_factory=Mentions)

    @property
    def policy(self) -> ChannelPolicy:
        return ChannelPolicy(self.name, "wecom", self.limits, self.max_individual)

    def build(self, message: Message, now_s: float) -> HttpRequest:
        body: dict[str, Any]
        who = self.mentions.for_message(message)
        links = self.links.for_message(message, now_s)
        if self.msgtype == "markdown":
            tail = [" · ".join(f"[{x.label}]({x.url})" for x in links)] if links else []
            if who.user_ids:
                tail.append(" ".join(f"<@{uid}>" for uid in who.user_ids))
            end = "".join("\n" + line for line in tail)
            content = truncate_utf8(markdown(message), MAX_MARKDOWN_BYTES - len(end.encode()))
            body = {"msgtype": "markdown", "markdown": {"content": content + end}}
        else:
            end = "".join(f"\n{x.label}: {x.url}" for x in links)
            content = truncate_utf8(plain_text(message), MAX_TEXT_BYTES - len(end.encode()))
            text: dict[str, Any] = {"content": content + end}
            users = [*who.user_ids, *(["@all"] if who.all else [])]
            if users:
                text["mentioned_list"] = users
            if who.mobiles:
                text["mentioned_mobile_list"] = list(who.mobiles)
            body = {"msgtype": "text", "text": text}
        return HttpRequest(url=self.url.reveal(), body=json.dumps(body).encode(),
                           shown=shown_url(self.url.reveal()), check=WECOM_REPLY)
