from __future__ import annotations

import pytest

from trainguard.events import encode, partition_key
from trainguard.events.registry import BY_NAME, EVENT_TYPES, URGENT_TYPES
from trainguard.events.samples import sample_events
from trainguard.events.topics import (
    EVENT_ROLES,
    SPEC_BY_ROLE,
    TOPIC_SPECS,
    TopicNames,
    TopicRole,
)


def test_every_role_has_one_spec_and_every_type_a_topic() -> None:
    assert {s.role for s in TOPIC_SPECS} == set(TopicRole)
    assert len(TOPIC_SPECS) == len(TopicRole)
    for t in EVENT_TYPES:
        assert t.topic in SPEC_BY_ROLE
        assert SPEC_BY_ROLE[t.topic].key == t.key_by


def test_the_event_log_keeps_everything() -> None:
    for spec in TOPIC_SPECS:
        cfg = spec.configs()
        # the urgent topic holds copies: each original is on its own topic, kept for good
        assert cfg["retention.ms"] == ("604800000" if spec.role is TopicRole.URGENT else "-1")
        assert cfg["retention.bytes"] == "-1"
        assert cfg["cleanup.policy"] == "delete"


def test_keys_follow_the_registry() -> None:
    for ev in sample_events(job_id="job-77"):
        assert BY_NAME[ev.type].key_by == "job"
        assert partition_key(ev) == b"job-77"
        assert encode(ev)


def test_telemetry_and_task_are_co_partitioned() -> None:
    # keyed by job on both, a job's records land on the same partition number of each only
    # when the counts are equal: the streams worker relies on it
    assert SPEC_BY_ROLE[TopicRole.TELEMETRY].partitions == SPEC_BY_ROLE[TopicRole.TASK].partitions
    assert SPEC_BY_ROLE[TopicRole.URGENT].partitions == SPEC_BY_ROLE[TopicRole.TASK].partitions


def test_urgent_types_are_copied_to_the_urgent_topic_and_the_log_reads_each_event_once() -> None:
    assert {"process.exit", "node.health"} == URGENT_TYPES
    for t in EVENT_TYPES:
        assert t.topics == ((t.topic, TopicRole.URGENT) if t.name in URGENT_TYPES
                            else (t.topic,))
        assert t.topic in EVENT_ROLES
    assert TopicRole.URGENT not in EVENT_ROLES and TopicRole.DLQ not in EVENT_ROLES


def test_prefix_names_and_reverse_lookup() -> None:
    names = TopicNames("t42")
    assert names.name(TopicRole.TASK) == "t42.task"
    assert names.role_of("t42.verdicts") is TopicRole.VERDICTS
    with pytest.raises(KeyError):
        names.role_of("tg.verdicts")
