"""The timeline as Markdown (tables per track). Every text that is not this module's own goes
through ``escape.markdown``: no raw HTML, no Markdown construct, no broken table row."""

from __future__ import annotations

from trainguard.events.clock import to_iso
from trainguard.text.escape import markdown as _cell
from trainguard.timeline.fmt import clock, duration, rel, state_line
from trainguard.timeline.model import TRACK_TITLES, TRACKS, Timeline


def render_markdown(tl: Timeline) -> str:
    zero = tl.opened_at
    out = [
        f"# Incident {_cell(tl.incident_id)}",
        "",
        f"- job: {_cell(tl.job_id)}; subject: {_cell(tl.subject)}",
        f"- state: **{_cell(state_line(tl))}**; verdicts: {_cell(', '.join(tl.verdict_kinds))}",
        f"- opened {to_iso(tl.opened_at)}, closed "
        f"{to_iso(tl.closed_at) if tl.closed_at else '-'} ({duration(tl)})",
        "",
        "## The four questions",
        "",
        "| # | question | when | answer |",
        "|---|---|---|---|",
    ]
    for i, a in enumerate(tl.answers, 1):
        at = f"{clock(a.time)} ({rel(a.time, zero)})" if a.time is not None else "-"
        out.append(f"| {i} | {_cell(a.question)} | {at} | {_cell(a.text)} |")
    out += ["", "## Transitions", "", "| time | T+ | from | to | tier | reason |",
            "|---|---|---|---|---|---|"]
    for s in tl.transitions:
        out.append(f"| {clock(s.time)} | {rel(s.time, zero)} | {_cell(s.from_state or '-')} | "
                   f"{_cell(s.to_state)} | {s.tier if s.tier is not None else '-'} | "
                   f"{_cell(s.reason)} |")
    for track in TRACKS:
        out += ["", f"## {TRACK_TITLES[track]}", ""]
        marks = tl.track(track)
        if not marks:
            out.append("_nothing in this window_")
            continue
        out += ["| time | T+ | until | lane | what | detail |", "|---|---|---|---|---|---|"]
        for m in marks:
            until = clock(m.end) if m.end is not None else ""
            out.append(f"| {clock(m.time)} | {rel(m.time, zero)} | {until} | {_cell(m.lane)} | "
                       f"{_cell(m.label)} | {_cell(m.detail)} |")
    return "\n".join(out) + "\n"
