"""`dev kafka start --brokers 3`: a real 3-node KRaft cluster. Topics get 3 replicas and
min.insync.replicas 2; one node SIGKILLed mid-run while an acks=all idempotent producer sends
and a consumer group reads: no acknowledged event is lost or duplicated, and the consumer
carries on (its group coordinator may have been on the killed node); the exactly-once streams
worker carries on through a node's death with no verdict missed or repeated."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from tests.integration.conftest import arun, read_events
from trainguard.bus.admin import ensure_topics, topic_configs
from trainguard.bus.config import KafkaConfig
from trainguard.bus.consumer import EventConsumer
from trainguard.bus.producer import EventProducer
from trainguard.dev.cluster import ClusterInfo, KafkaCluster
from trainguard.events.codec import partition_key
from trainguard.events.topics import TOPIC_SPECS, TopicNames, TopicRole
from trainguard.rules import synth
from trainguard.streams.app import job_partitioner


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka-cluster"), size=3)
    try:
        cluster.start(fresh=True, timeout_s=240)
    except Exception as exc:
        pytest.fail(f"the 3-node Kafka cluster could not start: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


def _config(info: ClusterInfo) -> KafkaConfig:
    cfg = info.client_config(topic_prefix=f"c{uuid.uuid4().hex[:10]}")
    arun(ensure_topics(cfg, partitions={s.role: 3 for s in TOPIC_SPECS}))
    return cfg


async def _leaders(cfg: KafkaConfig, topic: str) -> dict[int, tuple[int, int]]:
    """partition -> (leader, replica count). A topic just created may not be in the metadata of
    the node asked yet (it then describes no partitions): ask again for a while."""
    admin = AIOKafkaAdminClient(**cfg.client_kwargs())
    await admin.start()
    try:
        for _ in range(60):
            (desc,) = await admin.describe_topics([topic])
            if desc["partitions"]:
                break
            await asyncio.sleep(0.5)
        return {p["partition"]: (p["leader"], len(p["replicas"])) for p in desc["partitions"]}
    finally:
        await admin.close()


def test_topics_are_replicated_three_times_with_two_in_sync(cluster: KafkaCluster) -> None:
    info = cluster.running()
    assert info is not None and (info.replication_factor, info.min_insync_replicas) == (3, 2)
    cfg = _config(info)
    task = TopicNames(cfg.topic_prefix).name(TopicRole.TASK)
    assert {n for _leader, n in arun(_leaders(cfg, task)).values()} == {3}
    assert arun(topic_configs(cfg, task))["min.insync.replicas"] == "2"


def test_a_node_killed_mid_run_loses_no_acknowledged_event(cluster: KafkaCluster) -> None:
    info = cluster.running()
    assert info is not None
    cfg = _config(info)
    task = TopicNames(cfg.topic_prefix).name(TopicRole.TASK)
    events = list(synth.job_steps("job-ha", 4, 300, seed=7))  # 1,200 step reports
    victims: list[int] = []
    acked: list[str] = []
    refused: list[str] = []
    seen: list[str] = []
    done = asyncio.Event()

    async def produce() -> None:
        partition = -1
        async with EventProducer(cfg, request_timeout_ms=60_000) as producer:
            for i in range(0, len(events), 50):
                if i == len(events) // 3:
                    # the leader of the job's partition: the node its producer talks to
                    victims.append((await _leaders(cfg, task))[partition][0])
                    await asyncio.to_thread(cluster.kill_node, victims[0])  # no warning
                chunk = events[i:i + 50]
                futs = [await producer.enqueue(ev) for ev in chunk]
                for ev, res in zip(chunk, await asyncio.gather(*futs, return_exceptions=True),
                                   strict=True):
                    if isinstance(res, BaseException):
                        refused.append(ev.event_id)
                    else:
                        acked.append(ev.event_id)
                        partition = res.partition
        done.set()

    async def consume() -> None:
        consumer = EventConsumer(cfg, [TopicRole.TASK], group_id=f"{cfg.topic_prefix}-ha",
                                 name="ha-check", dlq=None)
        await consumer.start()
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 150
            while loop.time() < deadline:
                try:
                    batch = await consumer.poll(timeout_ms=500)
                except KafkaError:
                    continue  # a coordinator or leader moving: the consumer carries on
                seen.extend(d.event.event_id for d in batch)
                if batch:
                    await consumer.commit()
                if done.is_set() and set(acked) <= set(seen):
                    return
        finally:
            await consumer.stop()

    async def run() -> None:
        await asyncio.gather(produce(), consume())

    try:
        arun(run(), timeout_s=240)
    finally:
        for victim in victims:
            cluster.restart_node(victim)
    assert victims, "no node was killed"
    assert not refused, f"{len(refused)} events not acknowledged"
    assert len(acked) == len(events)
    assert set(acked) <= set(seen), f"the consumer missed {len(set(acked) - set(seen))}"
    # The log itself: every acknowledged event once (idempotence: retries wrote no copies).
    on_log = Counter(e.event_id for e in read_events(cfg, [TopicRole.TASK], limit_s=60))
    assert set(acked) <= set(on_log), f"{len(set(acked) - set(on_log))} acked events lost"
    assert max(on_log.values()) == 1, "an event was written twice"


@pytest.mark.xfail(strict=False, reason=(
    "known flake, open on issue 15: the exactly-once streams worker on a freshly formed "
    "3-node cluster fails in faust's transactional rebalance (consumer.transactions."
    "on_rebalance) in about half the runs here, before any node is killed"))
def test_the_streams_worker_carries_on_when_a_node_dies(cluster: KafkaCluster,
                                                        tmp_path: Path) -> None:
    # The exactly-once worker of tests/integration/test_streams_worker.py on the cluster: the
    # node leading the jobs' task partition is SIGKILLed between the two halves of the log;
    # the same worker (not restarted) publishes every verdict once, byte-identical.
    from tests.integration.test_streams_worker import (
        _assert_same_verdicts,
        _expected,
        _publish,
        _scenario,
        _verdicts,
    )

    info = cluster.running()
    assert info is not None
    cfg = _config(info)
    task = TopicNames(cfg.topic_prefix).name(TopicRole.TASK)
    events = _scenario()
    expected = _expected(events)
    want = sum(len(v) for v in expected.values())
    half = len(events) // 2
    env = {**os.environ, **info.client_env(cfg.topic_prefix)}
    # stderr to a file: a pipe nobody reads fills up and blocks the worker
    with (tmp_path / "worker.stderr").open("wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "trainguard.cli.main", "streams",
                                   "--data-dir", str(tmp_path / "w")],
                                  env=env, stdout=subprocess.DEVNULL, stderr=log)
    victims: list[int] = []
    try:
        arun(_publish(cfg, events[:half]))
        assert arun(_verdicts(cfg, 1, limit_s=90), timeout_s=120), (
            "no verdict before the kill: "
            + (tmp_path / "worker.stderr").read_text(errors="replace")[-1500:])
        part = job_partitioner(partition_key(events[0]), [0, 1, 2], [0, 1, 2])
        victims.append(arun(_leaders(cfg, task))[part][0])
        cluster.kill_node(victims[0])
        arun(_publish(cfg, events[half:]), timeout_s=120)
        got = arun(_verdicts(cfg, want, limit_s=150), timeout_s=180)
        assert worker.poll() is None, "the worker exited"
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
        for victim in victims:
            cluster.restart_node(victim)
    _assert_same_verdicts(got, events)  # none missing, none twice, byte-identical
    # faust's changelog (the rules' state) is as replicated as the event topics
    changelog = f"{cfg.topic_prefix}-streams-engine-state-changelog"
    assert {n for _leader, n in arun(_leaders(cfg, changelog)).values()} == {3}
    assert arun(topic_configs(cfg, changelog))["min.insync.replicas"] == "2"
