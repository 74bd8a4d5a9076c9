"""The served incident pages (``trainguard incident serve --http-port``): routing and rendering,
pure. The HTTP edge (``incidents/webserver.py``) hands each request's method and path here
and writes back the ``Page``; what is shown is read from an ``IncidentSource`` at request
time: the incident service's live fold and the events it keeps (``incidents/context.py``).

Routes (read-only: GET and HEAD; any other method is 405):

- ``/``: every incident, newest first (id, verdict kinds, job, where, state, first and last
  time, links); the page reloads itself every ``LIST_REFRESH_S`` (a meta refresh, no script).
- ``/incidents/<incident_id>``: the incident's timeline page, the same HTML as
  ``incident show --format html`` (everything not the renderer's own is escaped) plus a link
  back to the list and, while the incident is open, a meta refresh.
- ``/incidents/<incident_id>.json``: the timeline as JSON (``--format json``).
- ``/incidents.json``: the list as JSON. ``/healthz``: ``ok`` and the counts, as JSON.

An incident id is 32 lowercase hex digits (``events.ids.derived_id``); any other name is a
404 without a look-up, so no path reaches anything but the in-memory incidents. Links are
relative, so the pages also work behind a reverse proxy that serves them under a prefix.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from trainguard.events.clock import to_iso
from trainguard.events.envelope import Event
from trainguard.incidents.model import Incident
from trainguard.text.escape import html as escape
from trainguard.timeline.build import build_timeline
from trainguard.timeline.render import render_json
from trainguard.timeline.render_html import CSS, render_html

METHODS = ("GET", "HEAD")
INCIDENT_ID = re.compile(r"[0-9a-f]{32}")
PREFIX = "/incidents/"
LIST_REFRESH_S = 10
OPEN_REFRESH_S = 10
HTML = "text/html; charset=utf-8"
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
NO_STORE = (("Cache-Control", "no-store"),)  # live state: a reload asks again


class IncidentSource(Protocol):
    """What the pages read: the incidents as folded now, and the events around one."""

    def incidents(self) -> list[Incident]: ...

    def events_for(self, inc: Incident) -> Sequence[Event]: ...


@dataclass(frozen=True)
class Page:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = NO_STORE


def incident_path(incident_id: str) -> str:
    """The page of one incident, relative to the server's base URL (others link to it)."""
    return f"{PREFIX}{incident_id}"


def valid_id(text: str) -> bool:
    return INCIDENT_ID.fullmatch(text) is not None


def root_href(path: str) -> str:
    """The relative link from ``path`` back to ``/`` (works under a proxy's prefix too)."""
    depth = max(path.count("/") - 1, 0)
    return "../" * depth or "./"


@dataclass(frozen=True)
class TimelineRequest:
    """A timeline page to build: the incident copied off the live fold with the events around
    it, so that it can be built and rendered outside the fold's loop (``render_timeline``)."""

    incident: Incident
    events: list[Event]
    fmt: str  # html | json
    path: str


def resolve(method: str, path: str, source: IncidentSource) -> Page | TimelineRequest:
    """The page for one request, or the timeline to render for it. ``path`` is the URL path,
    percent-decoded, without the query. HEAD gets GET's page (the edge leaves the body out)."""
    if method not in METHODS:
        return Page(405, TEXT, f"405 method not allowed: {method} (read-only: GET, HEAD)\n"
                    .encode(), (*NO_STORE, ("Allow", ", ".join(METHODS))))
    if path == "/":
        return Page(200, HTML, render_index(rows(source.incidents())).encode())
    if path == "/incidents.json":
        return Page(200, JSON, orjson.dumps([r.to_dict() for r in rows(source.incidents())],
                                            option=orjson.OPT_INDENT_2))
    if path == "/healthz":
        incs = source.incidents()
        body = {"status": "ok", "incidents": len(incs),
                "open": sum(1 for i in incs if not i.terminal)}
        return Page(200, JSON, orjson.dumps(body))
    if path.startswith(PREFIX):
        name = path[len(PREFIX):]
        fmt = "html"
        if name.endswith(".json"):
            name, fmt = name[:-len(".json")], "json"
        if not valid_id(name):
            return not_found(path, "not an incident id (32 hex digits)")
        inc = next((i for i in source.incidents() if i.incident_id == name), None)
        if inc is None:
            return not_found(path, f"no incident {name} (yet): the list shows every incident "
                             "the service has folded")
        return TimelineRequest(copy.deepcopy(inc), list(source.events_for(inc)), fmt, path)
    return not_found(path, "no such page")


def render_timeline(req: TimelineRequest) -> Page:
    tl = build_timeline(req.incident, req.events)
    if req.fmt == "json":
        return Page(200, JSON, render_json(tl).encode())
    refresh = None if req.incident.terminal else OPEN_REFRESH_S
    return Page(200, HTML, render_html(tl, back_href=root_href(req.path), refresh_s=refresh)
                .encode())


def route(method: str, path: str, source: IncidentSource) -> Page:
    """``resolve`` and, for a timeline, ``render_timeline`` in one call."""
    got = resolve(method, path, source)
    return got if isinstance(got, Page) else render_timeline(got)


def not_found(path: str, why: str) -> Page:
    body = _page("not found", f'<h1>404: not found</h1><p id="why">{escape(path)}: '
                 f'{escape(why)}</p><p><a href="{escape(root_href(path))}">all incidents</a></p>')
    return Page(404, HTML, body.encode())


@dataclass(frozen=True)
class Row:
    """One incident in the list."""

    incident_id: str
    job_id: str
    where: str
    kinds: str
    severity: str
    state: str
    tier: int | None
    open: bool
    first_time: int  # the first anomalous sample of its verdicts (or its opening)
    opened_at: int
    last_time: int  # its close, else the latest event it folded

    def to_dict(self) -> dict[str, Any]:
        return {"incident_id": self.incident_id, "job_id": self.job_id, "where": self.where,
                "verdict_kinds": self.kinds, "severity": self.severity, "state": self.state,
                "tier": self.tier, "open": self.open, "first_time": to_iso(self.first_time),
                "opened_at": to_iso(self.opened_at), "last_time": to_iso(self.last_time),
                "href": incident_path(self.incident_id)}


def row(inc: Incident) -> Row:
    where = ", ".join(f"{k} {v}" for k, v in inc.subject.model_dump(exclude_none=True).items())
    first = min([v.first_time for v in inc.verdicts.values()] + [inc.opened_at])
    return Row(incident_id=inc.incident_id, job_id=inc.job_id, where=where or "the job",
               kinds=", ".join(sorted({str(v.kind) for v in inc.verdicts.values()})),
               severity=inc.opening_severity.value if inc.verdicts else "?",
               state=inc.state.value if inc.state else "?", tier=inc.tier,
               open=not inc.terminal, first_time=first, opened_at=inc.opened_at,
               last_time=inc.closed_at if inc.closed_at is not None
               else max(inc.last_time, inc.opened_at))


def rows(incidents: Sequence[Incident]) -> list[Row]:
    """Newest first (then by id: the same state gives the same page)."""
    return sorted((row(i) for i in incidents),
                  key=lambda r: (-r.opened_at, r.incident_id))


LIST_CSS = """
.open{color:#d0342c;font-weight:600} .closed{color:#2e9b4f}
td.id{font-family:monospace} nav{margin-bottom:12px}
"""


def render_index(items: Sequence[Row], refresh_s: int = LIST_REFRESH_S) -> str:
    n_open = sum(1 for r in items if r.open)
    head = ["<tr><th>incident</th><th>verdicts</th><th>severity</th><th>job</th><th>where</th>"
            "<th>state</th><th>first sign</th><th>opened</th><th>last</th><th>links</th></tr>"]
    body = []
    for r in items:
        href = escape(incident_path(r.incident_id).lstrip("/"))
        tier = f" (tier {r.tier})" if r.tier is not None else ""
        cls = "open" if r.open else "closed"
        body.append(
            f'<tr class="incident" data-incident="{escape(r.incident_id)}" '
            f'data-state="{escape(r.state)}"><td class="id"><a href="{href}" '
            f'title="{escape(r.incident_id)}">{escape(r.incident_id[:12])}</a></td>'
            f"<td>{escape(r.kinds)}</td><td>{escape(r.severity)}</td>"
            f"<td>{escape(r.job_id)}</td><td>{escape(r.where)}</td>"
            f'<td class="{cls}">{escape(r.state + tier)}</td>'
            f"<td>{escape(to_iso(r.first_time))}</td><td>{escape(to_iso(r.opened_at))}</td>"
            f"<td>{escape(to_iso(r.last_time))}</td>"
            f'<td><a href="{href}">timeline</a> · <a href="{href}.json">json</a></td></tr>')
    table = ('<table id="incidents">' + "".join(head + body) + "</table>" if items
             else '<p id="empty"><i>no incidents yet</i></p>')
    content = (f'<h1>Incidents</h1><p class="meta" id="counts">{len(items)} incident(s), '
               f"{n_open} open · served live by the incident service: the page reloads every "
               f"{refresh_s} s · <a href=\"incidents.json\">json</a></p>" + table)
    return _page("incidents", content, refresh_s=refresh_s, css=LIST_CSS)


def _page(title: str, content: str, refresh_s: int | None = None, css: str = "") -> str:
    refresh = f'<meta http-equiv="refresh" content="{refresh_s}">' if refresh_s else ""
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">' + refresh
            + f"<title>trainguard: {escape(title)}</title><style>{CSS}{css}</style></head>"
            + f"<body>{content}</body></html>\n")
