"""Generic JSON webhook: the notices as data, plus a rendered ``text``; optionally signed with
an HMAC (``X-Trainguard-Timestamp``, ``X-Trainguard-Signature: sha256=<hex>`` over
``f"{timestamp}." + body``). Any 2xx is delivered. Each notice carries ``severity``,
``verdict_kind`` and its ``links`` (``grafana``, ``timeline``: null when not configured)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trainguard.alerts.channels.base import JSON_HEADERS, ChannelPolicy, HttpRequest
from trainguard.alerts.links import NO_LINKS, Links
from trainguard.alerts.model import Notice
from trainguard.alerts.ratelimit import Limit
from trainguard.alerts.render import Message, incident_title, plain_text, title
from trainguard.alerts.secrets import Secret, shown_url
from trainguard.alerts.signing import webhook_sign
from trainguard.events.clock import US_PER_S, to_iso

WEBHOOK_LIMITS = (Limit(10, 1.0),)
SCHEMA_VERSION = 1


def notice_doc(n: Notice, links: Links | None = None, now_us: int = 0) -> dict[str, Any]:
    links = links or NO_LINKS
    return {
        "kind": n.kind.value, "incident_id": n.incident_id, "job_id": n.job_id,
        "thread_key": n.thread_key, "thread_title": incident_title(n), "ref": n.ref,
        "state": n.state.value, "reason": n.reason, "tier": n.tier, "node": n.node,
        "rank": n.rank, "opened_at": to_iso(n.opened_at_us), "at": to_iso(n.at_us),
        "opened_at_us": n.opened_at_us, "at_us": n.at_us, "transitions": n.transitions,
        "severity": None if n.severity is None else n.severity.value,
        "verdict_kind": None if n.verdict_kind is None else n.verdict_kind.value,
        "links": {"grafana": links.grafana(n, now_us), "timeline": links.timeline(n)},
    }


def message_doc(message: Message, links: Links | None = None,
                now_s: float = 0.0) -> dict[str, Any]:
    now_us = int(now_s * US_PER_S)
    return {"source": "trainguard", "schema_version": SCHEMA_VERSION,
            "digest": message.digest, "title": title(message), "text": plain_text(message),
            "notices": [notice_doc(n, links, now_us) for n in message.notices]}


@dataclass(frozen=True)
class WebhookChannel:
    name: str
    url: Secret
    secret: Secret | None = None
    limits: tuple[Limit, ...] = WEBHOOK_LIMITS
    max_individual: int = 5
    links: Links = NO_LINKS

    @property
    def policy(self) -> ChannelPolicy:
        return ChannelPolicy(self.name, "webhook", self.limits, self.max_individual)

    def build(self, message: Message, now_s: float) -> HttpRequest:
        body = json.dumps(message_doc(message, self.links, now_s)).encode()
        headers = dict(JSON_HEADERS)
        if self.secret is not None:
            ts = int(now_s)
            headers["X-Trainguard-Timestamp"] = str(ts)
            headers["X-Trainguard-Signature"] = webhook_sign(ts, body, self.secret.reveal())
        return HttpRequest(url=self.url.reveal(), body=body, headers=headers,
                           shown=shown_url(self.url.reveal()))
