"""The streams app's table layout (trainguard/streams/state.py): a job's engine saved once per
batch without its buffered events, which live in per-batch chunks; a worker restarted at any
batch boundary resumes exactly."""

from __future__ import annotations

import random

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.test_rules_determinism import RULES, shuffled
from trainguard.events.codec import encode
from trainguard.rules import engine_factory
from trainguard.streams.state import CHUNK, JobStore

pytestmark = pytest.mark.unit


def run(seed: int, restarts: list[int], batch_max: int) -> tuple[list[bytes], dict[bytes, bytes]]:
    arrivals = shuffled(seed, 0.1)
    rng = random.Random(seed)
    factory = engine_factory(RULES, prompt=True)
    table: dict[bytes, bytes] = {}
    store = JobStore(table, "j")
    engine = factory("j", store.load())
    out: list[bytes] = []
    i = batch = 0
    while i < len(arrivals):
        if batch in restarts:  # a new worker: everything from the table
            store = JobStore(table, "j")
            engine = factory("j", store.load())
        chunk = arrivals[i:i + rng.randint(1, batch_max)]
        i += len(chunk)
        batch += 1
        before = engine.buffered_ids()
        raw = {e.event_id: encode(e) for e in chunk}
        for e in chunk:
            out.extend(encode(v) for v in engine.feed(e))
        store.save(engine, before, raw)
    return out, table


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), restarts=st.lists(st.integers(0, 60), max_size=4),
       batch_max=st.sampled_from([1, 7, 50]))
def test_restart_at_any_batch_resumes_exactly(seed: int, restarts: list[int],
                                              batch_max: int) -> None:
    whole, table = run(seed, [], batch_max)
    again, table2 = run(seed, restarts, batch_max)
    assert again == whole
    assert table2 == table


def test_snapshot_leaves_events_out_and_chunks_are_deleted_when_released() -> None:
    out, table = run(1, [], 20)
    assert out
    doc = orjson.loads(table[b"j"])
    assert "buffered" not in doc["buffer"] and doc["buffer"]["ids"]
    chunks = [k for k in table if CHUNK in k]
    assert sorted(chunks) == sorted(b"j" + CHUNK + str(n).encode()
                                    for n in doc["store"]["live"])
    # only the chunks of the last lateness bound's batches are still there
    assert 0 < len(chunks) < doc["store"]["next"] / 4
    # every buffered event is in a live chunk
    kept = {e["event_id"] for k in chunks for e in orjson.loads(table[k])}
    assert set(doc["buffer"]["ids"]) <= kept


@given(job=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,40}", fullmatch=True),
       n=st.integers(0, 10**6), parts=st.integers(1, 64))
def test_a_jobs_keys_share_its_partition(job: str, n: int, parts: int) -> None:
    from aiokafka.partitioner import DefaultPartitioner

    from trainguard.streams.app import job_partitioner
    from trainguard.streams.state import chunk_key

    all_parts = list(range(parts))
    plain = DefaultPartitioner()(job.encode(), all_parts, all_parts)
    assert job_partitioner(job.encode(), all_parts, all_parts) == plain
    assert job_partitioner(chunk_key(job.encode(), n), all_parts, all_parts) == plain
