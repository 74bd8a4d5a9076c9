"""The timeline as one self-contained HTML page: inline CSS and an inline SVG swimlane chart,
no script, no external reference (it opens offline, from a file or a chat attachment). Every
text that is not this module's own goes through ``escape.html``, attributes included."""

from __future__ import annotations

from collections.abc import Callable

from trainguard.events.clock import to_iso
from trainguard.text.escape import html as escape
from trainguard.timeline.fmt import clock, duration, rel, state_line
from trainguard.timeline.model import TRACK_TITLES, TRACKS, Mark, Timeline

WIDTH = 1240
LEFT = 230
RIGHT = 20
TOP = 34
TRACK_HEAD = 20
LANE = 18
COLOURS = {"info": "#4a78c2", "warn": "#e8a317", "bad": "#d0342c", "good": "#2e9b4f"}
BANDS = {"task": "#eef3fb", "network": "#f3eefb", "gpu": "#fbf3ee", "resources": "#eefbf3",
         "actions": "#fbeef3", "detection": "#f6f6ee"}
TICKS_S = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600)

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d1d1f}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
.meta{color:#555} .state{font-weight:600}
ol.answers{padding-left:20px} ol.answers li{margin:6px 0}
.answer .q{font-weight:600} .answer .when{font-family:monospace;color:#333;margin-left:6px}
.answer.missing .text{color:#a05a00}
table{border-collapse:collapse;font-size:12px;margin-bottom:8px}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
svg text{font:11px system-ui,sans-serif} svg .track-title{font-weight:600;font-size:12px}
svg .lane-label{fill:#333} svg .tick{fill:#666} svg .qline{stroke:#111;stroke-dasharray:4 3}
"""


def render_html(tl: Timeline, *, back_href: str | None = None,
                refresh_s: int | None = None) -> str:
    """``back_href`` and ``refresh_s``: the served page (``incident serve --http-port``) links
    back to the incident list and, while the incident is open, reloads itself (a meta refresh,
    no script). The file written by ``incident show`` has neither."""
    zero = tl.opened_at
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        *([f'<meta http-equiv="refresh" content="{int(refresh_s)}">'] if refresh_s else []),
        f"<title>incident {escape(tl.incident_id[:12])} · {escape(tl.job_id)}</title>",
        f"<style>{CSS}</style></head><body>",
        *([f'<nav id="nav"><a href="{escape(back_href)}">all incidents</a> · served live: a '
           "reload shows new events</nav>"] if back_href is not None else []),
        f'<h1 id="title">Incident {escape(tl.incident_id)}</h1>',
        f'<div class="meta">job <b id="job">{escape(tl.job_id)}</b> · subject '
        f'{escape(tl.subject)} · state <span class="state" id="state">'
        f'{escape(state_line(tl))}</span> · opened {escape(to_iso(tl.opened_at))} · '
        f'{escape(duration(tl))} · verdicts {escape(", ".join(tl.verdict_kinds))}</div>',
        '<h2>The four questions</h2><ol class="answers" id="answers">',
    ]
    for i, a in enumerate(tl.answers, 1):
        when = f"{clock(a.time)} ({rel(a.time, zero)})" if a.time is not None else "—"
        cls = "answer" if a.answered else "answer missing"
        parts.append(f'<li class="{cls}" data-question="{escape(a.key)}"><span class="q">Q{i}. '
                     f'{escape(a.question)}</span><span class="when">{escape(when)}</span>'
                     f'<div class="text">{escape(a.text)}</div></li>')
    parts.append('</ol><h2>Swimlanes</h2><div id="chart">')
    parts.append(swimlanes(tl))
    parts.append("</div><h2>Transitions</h2><table id=\"transitions\"><tr><th>time</th>"
                 "<th>T+</th><th>from</th><th>to</th><th>tier</th><th>reason</th></tr>")
    for s in tl.transitions:
        parts.append(f"<tr><td>{clock(s.time)}</td><td>{rel(s.time, zero)}</td>"
                     f"<td>{escape(s.from_state or '-')}</td><td>{escape(s.to_state)}</td>"
                     f"<td>{'' if s.tier is None else s.tier}</td><td>{escape(s.reason)}</td>"
                     "</tr>")
    parts.append("</table><h2>Events by track</h2>")
    for track in TRACKS:
        marks = tl.track(track)
        parts.append(f'<h3 data-track="{track}">{escape(TRACK_TITLES[track])}</h3>')
        if not marks:
            parts.append("<p><i>nothing in this window</i></p>")
            continue
        parts.append("<table><tr><th>time</th><th>T+</th><th>until</th><th>lane</th>"
                     "<th>what</th><th>detail</th></tr>")
        for m in marks:
            until = clock(m.end) if m.end is not None else ""
            parts.append(f"<tr><td>{clock(m.time)}</td><td>{rel(m.time, zero)}</td>"
                         f"<td>{until}</td><td>{escape(m.lane)}</td><td>{escape(m.label)}</td>"
                         f"<td>{escape(m.detail)}</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _tick_step(span_s: float) -> float:
    for t in TICKS_S:
        if span_s / t <= 12:
            return t
    return TICKS_S[-1]


def swimlanes(tl: Timeline) -> str:
    plot = WIDTH - LEFT - RIGHT
    span = max(tl.end - tl.start, 1)

    def x(t: int) -> float:
        return round(LEFT + (min(max(t, tl.start), tl.end) - tl.start) * plot / span, 1)

    rows: list[str] = []
    y = TOP
    for track in TRACKS:
        lanes = tl.lanes(track) or ["(nothing)"]
        height = TRACK_HEAD + LANE * len(lanes)
        rows.append(f'<g class="track" data-track="{track}">'
                    f'<rect x="0" y="{y}" width="{WIDTH}" height="{height}" '
                    f'fill="{BANDS[track]}"/>'
                    f'<text class="track-title" x="6" y="{y + 14}">'
                    f'{escape(TRACK_TITLES[track])}</text>')
        for i, lane in enumerate(lanes):
            ly = y + TRACK_HEAD + i * LANE
            rows.append(f'<text class="lane-label" x="14" y="{ly + 13}">{escape(lane[:34])}'
                        "</text>")
            for m in tl.track(track):
                if m.lane == lane:
                    rows.append(_mark(m, x, ly))
        rows.append("</g>")
        y += height + 4
    height = y + 10
    axis = [f'<line x1="{LEFT}" y1="{TOP - 6}" x2="{WIDTH - RIGHT}" y2="{TOP - 6}" '
            'stroke="#999"/>']
    step_s = _tick_step(span / 1e6)
    k = int(((tl.start - tl.opened_at) / 1e6) // step_s)
    while True:
        t = tl.opened_at + int(k * step_s * 1e6)
        k += 1
        if t < tl.start:
            continue
        if t > tl.end:
            break
        axis.append(f'<line x1="{x(t)}" y1="{TOP - 10}" x2="{x(t)}" y2="{height - 10}" '
                    'stroke="#ddd"/>'
                    + (f'<text class="tick" x="{x(t) - 2}" y="{TOP - 12}" text-anchor="end">'
                       if x(t) > WIDTH - RIGHT - 50 else
                       f'<text class="tick" x="{x(t) + 2}" y="{TOP - 12}">')
                    + f'{rel(t, tl.opened_at)}</text>')
    qlines = []
    for i, a in enumerate(tl.answers, 1):
        if a.time is None:
            continue
        qlines.append(f'<g class="qmark" data-question="{escape(a.key)}"><line class="qline" '
                      f'x1="{x(a.time)}" y1="{TOP}" x2="{x(a.time)}" y2="{height + 11 * i}"/>'
                      f'<text x="{x(a.time) + 3}" y="{height + 11 * i}">Q{i}</text>'
                      f"<title>{escape(a.question)} {escape(a.text)}</title></g>")
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height + 52}" '
            f'viewBox="0 0 {WIDTH} {height + 52}" role="img" '
            f'aria-label="swimlane chart of incident {escape(tl.incident_id)}">'
            + "".join(axis) + "".join(rows) + "".join(qlines) + "</svg>")


def _mark(m: Mark, fx: Callable[[int], float], ly: int) -> str:
    colour = COLOURS.get(m.level, COLOURS["info"])
    title = f"<title>{escape(clock(m.time))} {escape(m.label)}"
    title += f" — {escape(m.detail)}</title>" if m.detail else "</title>"
    attrs = f'class="mark" data-level="{escape(m.level)}"'
    if m.end is not None and m.end > m.time:
        w = max(fx(m.end) - fx(m.time), 2.0)
        return (f'<g {attrs}><rect x="{fx(m.time)}" y="{ly + 4}" width="{w:.1f}" height="10" '
                f'rx="2" fill="{colour}" fill-opacity="0.75"/>{title}</g>')
    return (f'<g {attrs}><circle cx="{fx(m.time)}" cy="{ly + 9}" r="5" fill="{colour}"/>'
            f"{title}</g>")
