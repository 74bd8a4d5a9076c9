"""How far other services' consumer groups are behind on the event topics (records).

For each watched group: its committed offsets (admin API) against the partitions' end offsets.
Partitions outside this prefix's event topics (faust changelogs, other tenants) are ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainguard.events.topics import TopicNames


async def group_lags(admin: Any, consumer: Any, names: TopicNames,
                     groups: Sequence[str]) -> dict[tuple[str, str], int]:
    """(group, topic role) -> records behind, for every role the group has committed on."""
    out: dict[tuple[str, str], int] = {}
    for group in groups:
        committed = await admin.list_consumer_group_offsets(group)
        ours = {}
        for tp, meta in committed.items():
            try:
                role = names.role_of(tp.topic).value
            except KeyError:
                continue
            if meta.offset >= 0:
                ours[tp] = (role, meta.offset)
        if not ours:
            continue
        ends = await consumer.end_offsets(list(ours))
        for tp, (role, offset) in ours.items():
            out[(group, role)] = out.get((group, role), 0) + max(0, ends[tp] - offset)
    return out
