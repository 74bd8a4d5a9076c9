"""Text of the messages, shared by every chat channel; pure.

A ``Message`` is what one chat post says: one notice (the usual case), or a digest of many when
a storm makes more notices due at once than a channel should post one by one.

Every function that puts user-controlled text (job ids, node names, reasons) into a line takes
the channel's escaping function (``trainguard.text.escape``), ``plain`` by default; the fixed
words around it are the same in every format.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from trainguard.alerts.model import Notice, NoticeKind
from trainguard.events.clock import to_iso
from trainguard.text import escape

Escape = Callable[[str], str]

MARK = {
    NoticeKind.OPENED: "FAULT",
    NoticeKind.REOPENED: "FAULT AGAIN",
    NoticeKind.RECOVERED: "RECOVERED",
    NoticeKind.ESCALATED: "ESCALATED",
    NoticeKind.UNRECOVERABLE: "UNRECOVERABLE",
    NoticeKind.ENDED: "ENDED",
}
DIGEST_LINES = 20


@dataclass(frozen=True)
class Message:
    notices: tuple[Notice, ...]

    @property
    def digest(self) -> bool:
        return len(self.notices) != 1

    @property
    def title(self) -> str:
        return title(self)  # plain


def group(notices: Sequence[Notice], max_individual: int) -> list[Message]:
    """One message per notice, or a single digest when more than ``max_individual`` are due.

    ``max_individual=0`` always gives one message holding every notice (batch APIs).
    """
    if not notices:
        return []
    if max_individual and len(notices) <= max_individual:
        return [Message((n,)) for n in notices]
    return [Message(tuple(notices))]


def incident_title(n: Notice, esc: Escape = escape.plain) -> str:
    """The thread title: the same for every message about one incident."""
    return f"trainguard · {esc(n.job_id)} · {esc(n.ref)}"


def title(m: Message, esc: Escape = escape.plain) -> str:
    if not m.digest:
        n = m.notices[0]
        return f"[{MARK[n.kind]}] {incident_title(n, esc)}"
    counts = Counter(n.kind for n in m.notices)
    parts = ", ".join(f"{counts[k]} {k.value}" for k in NoticeKind if counts[k])
    incidents = len({n.incident_id for n in m.notices})
    return f"[DIGEST] trainguard · {incidents} incidents: {parts}"


def where(n: Notice, esc: Escape = escape.plain) -> str:
    parts = []
    if n.node:
        parts.append(f"node {esc(n.node)}")
    if n.rank is not None:
        parts.append(f"rank {n.rank}")
    return ", ".join(parts) or "job-wide"


def detail_lines(n: Notice, esc: Escape = escape.plain) -> list[str]:
    lines = [f"state: {n.state.value}" + (f" (tier {n.tier})" if n.tier else ""),
             f"where: {where(n, esc)}"]
    if n.reason:
        lines.append(f"reason: {esc(n.reason)}")
    lines.append(f"opened: {to_iso(n.opened_at_us)}")
    if n.kind not in (NoticeKind.OPENED, NoticeKind.REOPENED):
        lines.append(f"{n.kind.value}: {to_iso(n.at_us)} "
                     f"(after {(n.at_us - n.opened_at_us) / 1e6:.1f} s)")
    lines.append(f"transitions: {n.transitions}")
    lines.append(f"thread: {esc(n.thread_key)}")
    return lines


def digest_line(n: Notice, esc: Escape = escape.plain) -> str:
    return (f"[{MARK[n.kind]}] {esc(n.job_id)} · {esc(n.ref)} · {n.state.value} · "
            f"{where(n, esc)}")


def body_lines(m: Message, esc: Escape = escape.plain) -> list[str]:
    if not m.digest:
        return detail_lines(m.notices[0], esc)
    lines = [digest_line(n, esc) for n in m.notices[:DIGEST_LINES]]
    if len(m.notices) > DIGEST_LINES:
        lines.append(f"... and {len(m.notices) - DIGEST_LINES} more")
    return lines


def plain_text(m: Message) -> str:
    return "\n".join([title(m), *body_lines(m)])


def markdown(m: Message) -> str:
    """CommonMark: the title in bold, one bullet per line; user text ``escape.markdown``."""
    esc = escape.markdown
    return "\n".join([f"**{title(m, esc)}**", *(f"- {line}" for line in body_lines(m, esc))])


def truncate_utf8(text: str, max_bytes: int) -> str:
    """At most ``max_bytes`` of UTF-8, cut at a character boundary, marked when cut."""
    raw = text.encode()
    if len(raw) <= max_bytes:
        return text
    cut = raw[: max(0, max_bytes - 4)].decode(errors="ignore")
    return cut + " ..."
