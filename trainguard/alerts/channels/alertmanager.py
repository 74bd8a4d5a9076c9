"""Prometheus Alertmanager, API v2: ``POST /api/v2/alerts`` with a list of alerts.

One alert per incident, identified by its labels (``alertname``, ``incident_id``, ``job_id``,
``source``, and when known ``severity`` and ``verdict_kind`` of the opening verdict, ``node``
and ``rank`` where the incident was first seen) so every re-send updates the same alert and
routes can match on severity; what changes (state, where now, reason) is in the annotations,
with ``grafana_url`` and ``timeline_url``. ``generatorURL`` is the served timeline page (the
Grafana link when no timeline URL is configured). Firing alerts carry ``endsAt = now + 4 x
resend_s`` and are re-sent every ``resend_s`` while the incident is open, escalated or
unrecoverable (as Prometheus does); a recovery sends ``endsAt`` = the recovery's event time,
which resolves the alert. Alertmanager groups by ``incident_id``
(deploy/alertmanager/alertmanager.yml): one notification group, i.e. one thread, per incident.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trainguard.alerts.channels.base import JSON_HEADERS, ChannelPolicy, HttpRequest
from trainguard.alerts.links import NO_LINKS, Links
from trainguard.alerts.model import FIRING_KINDS, Notice
from trainguard.alerts.ratelimit import Limit
from trainguard.alerts.render import Message, detail_lines, incident_title, where
from trainguard.alerts.secrets import Secret
from trainguard.events.clock import US_PER_S, to_iso

ALERTMANAGER_LIMITS = (Limit(10, 1.0),)
ALERTNAME = "TrainguardIncident"


def labels(n: Notice) -> dict[str, str]:
    out = {"alertname": ALERTNAME, "incident_id": n.incident_id, "job_id": n.job_id,
           "source": "trainguard"}
    if n.severity is not None:
        out["severity"] = n.severity.value
    if n.verdict_kind is not None:
        out["verdict_kind"] = n.verdict_kind.value
    if n.first_node:
        out["node"] = n.first_node
    if n.first_rank is not None:
        out["rank"] = str(n.first_rank)
    return out


def alert_doc(n: Notice, now_s: float, resend_s: float,
              links: Links | None = None) -> dict[str, Any]:
    links = links or NO_LINKS
    now_us = int(now_s * US_PER_S)
    if n.kind not in FIRING_KINDS:  # recovered, or ended by the scheduler: resolved
        ends_us = max(min(n.at_us, now_us), n.opened_at_us + 1)
    else:
        ends_us = now_us + int(4 * resend_s * US_PER_S)
    annotations = {
        "summary": f"{incident_title(n)}: {n.kind.value} ({n.state.value})",
        "description": "\n".join(detail_lines(n)), "state": n.state.value,
        "notice": n.kind.value, "where": where(n), "thread_key": n.thread_key,
        "reason": n.reason, "tier": "" if n.tier is None else str(n.tier),
    }
    grafana, timeline = links.grafana(n, now_us), links.timeline(n)
    if grafana is not None:
        annotations["grafana_url"] = grafana
    if timeline is not None:
        annotations["timeline_url"] = timeline
    doc: dict[str, Any] = {
        "labels": labels(n),
        "annotations": annotations,
        "startsAt": to_iso(n.opened_at_us),
        "endsAt": to_iso(ends_us),
    }
    generator = timeline or grafana
    if generator is not None:
        doc["generatorURL"] = generator
    return doc


@dataclass(frozen=True)
class AlertmanagerChannel:
    name: str
    base_url: str
    resend_s: float = 60.0
    bearer_token: Secret | None = None
    limits: tuple[Limit, ...] = ALERTMANAGER_LIMITS
    links: Links = NO_LINKS

    @property
    def policy(self) -> ChannelPolicy:
        return ChannelPolicy(self.name, "alertmanager", self.limits, max_individual=0,
                             resend_s=self.resend_s)

    def build(self, message: Message, now_s: float) -> HttpRequest:
        # the latest notice per incident wins: one alert per label set in one post
        latest = {n.incident_id: n for n in message.notices}
        alerts = [alert_doc(n, now_s, self.resend_s, self.links) for n in latest.values()]
        headers = dict(JSON_HEADERS)
        if self.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.bearer_token.reveal()}"
        url = self.base_url.rstrip("/") + "/api/v2/alerts"
        return HttpRequest(url=url, body=json.dumps(alerts).encode(), headers=headers,
                           shown=url)
