"""The timeline as plain text for a terminal."""

from __future__ import annotations

from trainguard.events.clock import to_iso
from trainguard.timeline.fmt import clock, duration, rel, state_line
from trainguard.timeline.model import TRACKS, Timeline


def render_text(tl: Timeline) -> str:
    zero = tl.opened_at
    lines = [
        f"incident {tl.incident_id}  job {tl.job_id}  {state_line(tl)}",
        f"  subject {tl.subject}; verdicts: {', '.join(tl.verdict_kinds)}",
        f"  opened {to_iso(tl.opened_at)}  closed "
        f"{to_iso(tl.closed_at) if tl.closed_at else '-'}  ({duration(tl)})",
        f"  window {to_iso(tl.start)} .. {to_iso(tl.end)}; T = opening",
        "",
        "The four questions",
    ]
    for i, a in enumerate(tl.answers, 1):
        at = f"{clock(a.time)} ({rel(a.time, zero)})" if a.time is not None else "-"
        lines.append(f"  {i}. {a.question}")
        lines.append(f"     {at}  {a.text}")
    lines += ["", "Transitions"]
    for s in tl.transitions:
        tier = f" tier {s.tier}" if s.tier is not None else ""
        lines.append(f"  {clock(s.time)} {rel(s.time, zero):>9}  {s.from_state or '-':>10} -> "
                     f"{s.to_state}{tier}: {s.reason}")
    lines += ["", "Timeline"]
    for track in TRACKS:
        marks = tl.track(track)
        lines.append(f"  [{track}]" + ("" if marks else " (nothing in this window)"))
        for m in marks:
            span = f" .. {clock(m.end)}" if m.end is not None else ""
            lines.append(f"    {clock(m.time)} {rel(m.time, zero):>9}  {m.lane:<22} {m.label}"
                         f"{span}")
    return "\n".join(lines) + "\n"
