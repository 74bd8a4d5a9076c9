"""Prometheus Alertmanager, API v2: ``POST /api/v2/alerts`` with a list of alerts.

One alert per incident, identified by its labels (``alertname``, ``incident_id``, ``job_id``,
``source``) so every re-send updates the same alert; what changes (state, where, reason) is in
the annotations. Firing alerts carry ``endsAt = now + 4 x resend_s`` and are re-sent every
``resend_s`` while the incident is open, escalated or unrecoverable (as Prometheus does); a
recovery sends ``endsAt`` = the recovery's event time, which resolves the alert. Alertmanager
groups by ``incident_id`` (deploy/alertmanager/alertmanager.yml): one notification group, i.e.
one thread, per incident.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trainguard.alerts.channels.base import JSON_HEADERS, ChannelPolicy, HttpRequest
from trainguard.alerts.model import Notice, NoticeKind
from trainguard.alerts.ratelimit import Limit
from trainguard.alerts.render import Message, detail_lines, incident_title, where
from trainguard.alerts.secrets import Secret
from trainguard.events.clock import US_PER_S, to_iso

ALERTMANAGER_LIMITS = (Limit(10, 1.0),)
ALERTNAME = "TrainguardIncident"


def alert_doc(n: Notice, now_s: float, resend_s: float) -> dict[str, Any]:
    now_us = int(now_s * US_PER_S)
    if n.kind == NoticeKind.RECOVERED:
        ends_us = max(min(n.at_us, now_us), n.opened_at_us + 1)
    else:
        ends_us = now_us + int(4 * resend_s * US_PER_S)
    annotations = {
        "summary": f"{incident_title(n)}: {n.kind.value} ({n.state.value})",
        "description": "\n".join(detail_lines(n)), "state": n.state.value,
        "notice": n.kind.value, "where": where(n), "thread_key": n.thread_key,
        "reason": n.reason, "tier": "" if n.tier is None else str(n.tier),
    }
    return {
        "labels": {"alertname": ALERTNAME, "incident_id": n.incident_id, "job_id": n.job_id,
                   "source": "trainguard"},
        "annotations": annotations,
        "startsAt": to_iso(n.opened_at_us),
        "endsAt": to_iso(ends_us),
    }


@dataclass(frozen=True)
class AlertmanagerChannel:
    name: str
    base_url: str
    resend_s: float = 60.0
    bearer_token: Secret | None = None
    limits: tuple[Limit, ...] = ALERTMANAGER_LIMITS

    @property
    def policy(self) -> ChannelPolicy:
        return ChannelPolicy(self.name, "alertmanager", self.limits, max_individual=0,
                             resend_s=self.resend_s)

    def build(self, message: Message, now_s: float) -> HttpRequest:
        # the latest notice per incident wins: one alert per label set in one post
        latest = {n.incident_id: n for n in message.notices}
        alerts = [alert_doc(n, now_s, self.resend_s) for n in latest.values()]
        headers = dict(JSON_HEADERS)
        if self.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.bearer_token.reveal()}"
        url = self.base_url.rstrip("/") + "/api/v2/alerts"
        return HttpRequest(url=url, body=json.dumps(alerts).encode(), headers=headers,
                           shown=url)
