"""Where a message points: Grafana over the incident's time range, and the served timeline
page (``trainguard incident serve --http-port``). Pure: base URLs from the alerts config.

- Grafana: ``{grafana_url}/d/{dashboard_uid}?from=<ms>&to=<ms>&var-job=..&var-node=..&
  var-rank=..`` on the job dashboard (``dashboards/job.py``, uid ``tg-job``; its variables are
  ``job``, ``node`` and ``rank``). The range runs from ``pad_s`` before the incident opened to
  ``pad_s`` after its end (an end notice) or after now (still open).
- Timeline: ``{timeline_url}/incidents/<incident_id>`` (``incidents/web.py``'s route).

A digest points at the incidents dashboard over the span of its incidents and at the list
page (``{timeline_url}/``). Every value put in a URL is percent-encoded, so no user text can
end a link or add a query parameter.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote, urlencode

from trainguard.alerts.model import Notice, NoticeKind
from trainguard.alerts.render import Message
from trainguard.events.clock import US_PER_S
from trainguard.incidents.web import incident_path

JOB_DASHBOARD_UID = "tg-job"  # tests/unit/test_alerts_links.py checks it against the dashboard
INCIDENTS_DASHBOARD_UID = "tg-incidents"
DEFAULT_PAD_S = 300.0


@dataclass(frozen=True)
class Link:
    label: str  # fixed words, never user text
    url: str


@dataclass(frozen=True)
class Links:
    grafana_url: str | None = None
    timeline_url: str | None = None
    dashboard_uid: str = JOB_DASHBOARD_UID
    digest_dashboard_uid: str = INCIDENTS_DASHBOARD_UID
    pad_s: float = DEFAULT_PAD_S

    def time_range_ms(self, n: Notice, now_us: int) -> tuple[int, int]:
        """From ``pad_s`` before the opening to ``pad_s`` after the end (or now, if open)."""
        pad_us = int(self.pad_s * US_PER_S)
        ended = n.kind not in (NoticeKind.OPENED, NoticeKind.REOPENED)
        end_us = n.at_us if ended else max(now_us, n.at_us)
        return (n.opened_at_us - pad_us) // 1000, (end_us + pad_us) // 1000

    def grafana(self, n: Notice, now_us: int) -> str | None:
        if self.grafana_url is None:
            return None
        start, end = self.time_range_ms(n, now_us)
        query: list[tuple[str, str]] = [("from", str(start)), ("to", str(end)),
                                        ("var-job", n.job_id)]
        if n.node:
            query.append(("var-node", n.node))
        if n.rank is not None:
            query.append(("var-rank", str(n.rank)))
        return f"{_base(self.grafana_url)}/d/{quote(self.dashboard_uid, safe='')}?" \
               f"{urlencode(query)}"

    def timeline(self, n: Notice) -> str | None:
        if self.timeline_url is None:
            return None
        return _base(self.timeline_url) + quote(incident_path(n.incident_id), safe="/")

    def digest_grafana(self, m: Message, now_us: int) -> str | None:
        if self.grafana_url is None or not m.notices:
            return None
        ranges = [self.time_range_ms(n, now_us) for n in m.notices]
        query = [("from", str(min(r[0] for r in ranges))),
                 ("to", str(max(r[1] for r in ranges)))]
        return f"{_base(self.grafana_url)}/d/{quote(self.digest_dashboard_uid, safe='')}?" \
               f"{urlencode(query)}"

    def for_message(self, m: Message, now_s: float) -> list[Link]:
        """The buttons of a message: Grafana, then the timeline (those configured)."""
        now_us = int(now_s * US_PER_S)
        if m.digest:
            grafana = self.digest_grafana(m, now_us)
            timeline = None if self.timeline_url is None else _base(self.timeline_url) + "/"
            return [link for link in (_link("Grafana: incidents", grafana),
                                      _link("All incidents", timeline)) if link is not None]
        n = m.notices[0]
        return [link for link in (_link("Grafana", self.grafana(n, now_us)),
                                  _link("Timeline", self.timeline(n))) if link is not None]


def _base(url: str) -> str:
    return url.rstrip("/")


def _link(label: str, url: str | None) -> Link | None:
    return None if url is None else Link(label, url)


NO_LINKS = Links()  # nothing configured: messages carry no link
