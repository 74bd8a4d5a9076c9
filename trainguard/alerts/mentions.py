"""Who a message pings, per severity of the incident's opening verdict; pure.

A channel's config maps a severity to the people to mention (docs/alerts.md, "Mentions");
each chat channel writes them its vendor's way (Slack ``<@U…>``/``<!subteam^S…>``, Feishu
``at`` tags, DingTalk ``at.atMobiles``/``atUserIds``, WeCom ``mentioned_list``/
``mentioned_mobile_list``). Only messages that still need a human mention: an opening, a
reopening, an escalation or an unrecoverable incident; never a recovery or a periodic
re-send. A digest mentions for the most severe incident it holds that needs one.

Ids are checked against each vendor's id syntax when the config is read, so they go into the
message as they are: no user text ever forms a mention (the escape functions see to that).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from trainguard.alerts.model import Notice, NoticeKind
from trainguard.alerts.render import Message
from trainguard.events.payloads import Severity
from trainguard.incidents.settings import SEVERITY_RANK

MENTION_KINDS = frozenset({NoticeKind.OPENED, NoticeKind.REOPENED, NoticeKind.ESCALATED,
                           NoticeKind.UNRECOVERABLE})


@dataclass(frozen=True)
class Mention:
    user_ids: tuple[str, ...] = ()
    group_ids: tuple[str, ...] = ()  # Slack user groups (``S…``)
    mobiles: tuple[str, ...] = ()
    all: bool = False  # everyone in the chat (Slack ``<!channel>``, ``@all``)

    @property
    def empty(self) -> bool:
        return not (self.user_ids or self.group_ids or self.mobiles or self.all)


NOBODY = Mention()


@dataclass(frozen=True)
class Mentions:
    by_severity: Mapping[Severity, Mention] = field(default_factory=dict)

    def for_message(self, m: Message) -> Mention:
        severities = [n.severity for n in m.notices if _wants_human(n)]
        known = [s for s in severities if s is not None]
        if not known:
            return NOBODY
        return self.by_severity.get(max(known, key=SEVERITY_RANK.__getitem__), NOBODY)


def _wants_human(n: Notice) -> bool:
    return n.kind in MENTION_KINDS and not n.refresh


def slack_text(who: Mention) -> str:
    parts = [f"<@{u}>" for u in who.user_ids] + [f"<!subteam^{g}>" for g in who.group_ids]
    if who.all:
        parts.append("<!channel>")
    return " ".join(parts)


def at_text(who: Mention) -> str:
    """``@mobile @userid`` (DingTalk highlights a mention only when its text is present)."""
    parts = [f"@{x}" for x in (*who.mobiles, *who.user_ids)]
    if who.all:
        parts.append("@all")
    return " ".join(parts)
