"""DingTalk robot: markdown (or text); signed with ``timestamp`` (ms) and ``sign`` as query
parameters next to ``access_token``. Answers ``{"errcode": 0}``; 130101 means too fast.
20 messages per minute per robot (beyond that it is muted for 10 minutes).

Links (Grafana, the timeline) are Markdown links on the last line (bare URLs in ``text``);
mentions go in ``at`` (``atMobiles``, ``atUserIds``, ``isAtAll``) with the ``@…`` text
DingTalk needs in the message to highlight them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlencode

from trainguard.alerts.channels.base import ChannelPolicy, HttpRequest
from trainguard.alerts.links import NO_LINKS, Link, Links
from trainguard.alerts.mentions import Mention, Mentions, at_text
from trainguard.alerts.ratelimit import Limit
from trainguard.alerts.render import Message, markdown, plain_text, title, truncate_utf8
from trainguard.alerts.reply import ReplyCheck
from trainguard.alerts.secrets import Secret, shown_url
from trainguard.alerts.signing import dingtalk_sign

DINGTALK_LIMITS = (Limit(20, 60.0),)
DINGTALK_REPLY = ReplyCheck(code_keys=("errcode",), retry_codes=frozenset({-1, 130101}))
MAX_TEXT_BYTES = 19_000


def at_doc(who: Mention) -> dict[str, Any]:
    return {"atMobiles": list(who.mobiles), "atUserIds": list(who.user_ids),
            "isAtAll": who.all}


def tail_lines(links: list[Link], who: Mention, md: bool) -> list[str]:
    lines = []
    if links:
        lines.append(" · ".join(f"[{x.label}]({x.url})" if md else f"{x.label}: {x.url}"
                                for x in links))
    if not who.empty:
        lines.append(at_text(who))
    return lines


def signed_url(url: str, secret: str, timestamp_ms: int) -> str:
    sep = "&" if "?" in url else "?"
    query = urlencode({"timestamp": str(timestamp_ms),
                       "sign": dingtalk_sign(timestamp_ms, secret)})
    return f"{url}{sep}{query}"


@dataclass(frozen=True)
class DingTalkChannel:
    name: str
    url: Secret
    secret: Secret | None = None
    msgtype: Literal["markdown", "text"] = "markdown"
    limits: tuple[Limit, ...] = DINGTALK_LIMITS
    max_individual: int = 5
    links: Links = NO_LINKS
    mentions: Mentions = field(default_factory=Mentions)

    @property
    def policy(self) -> ChannelPolicy:
        return ChannelPolicy(self.name, "dingtalk", self.limits, self.max_individual)

    def build(self, message: Message, now_s: float) -> HttpRequest:
        body: dict[str, Any]
        who = self.mentions.for_message(message)
        md = self.msgtype == "markdown"
        tail = "".join("\n\n" + line for line in
                       tail_lines(self.links.for_message(message, now_s), who, md))
        room = MAX_TEXT_BYTES - len(tail.encode())  # links and mentions are never cut
        if md:
            body = {"msgtype": "markdown", "markdown": {
                "title": title(message),
                "text": truncate_utf8(markdown(message), room) + tail}}
        else:
            body = {"msgtype": "text",
                    "text": {"content": truncate_utf8(plain_text(message), room) + tail}}
        if not who.empty:
            body["at"] = at_doc(who)
        url = self.url.reveal()
        if self.secret is not None:
            url = signed_url(url, self.secret.reveal(), int(now_s * 1000))
        return HttpRequest(url=url, body=json.dumps(body).encode(),
                           shown=shown_url(self.url.reveal()), check=DINGTALK_REPLY)
