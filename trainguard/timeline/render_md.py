"""The timeline as Markdown (tables per track)."""

from __future__ import annotations

from trainguard.events.clock import to_iso
from trainguard.timeline.fmt import clock, duration, rel, state_line
from trainguard.timeline.model import TRACK_TITLES, TRACKS, Timeline


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(tl: Timeline) -> str:
    zero = tl.opened_at
    out = [
        f"# Incident `{tl.incident_id}`",
        "",
        f"- job: `{tl.job_id}`; subject: {tl.subject}",
        f"- state: **{state_line(tl)}**; verdicts: {', '.join(tl.verdict_kinds)}",
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
        out.append(f"| {i} | {a.question} | {at} | {_cell(a.text)} |")
    out += ["", "## Transitions", "", "| time | T+ | from | to | tier | reason |",
            "|---|---|---|---|---|---|"]
    for s in tl.transitions:
        out.append(f"| {clock(s.time)} | {rel(s.time, zero)} | {s.from_state or '-'} | "
                   f"{s.to_state} | {s.tier if s.tier is not None else '-'} | "
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
