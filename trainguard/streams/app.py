"""The faust app: node telemetry is re-keyed by job, then one agent feeds every job's events
to that job's rule engine and publishes the verdicts.

Partitioning: the task topic is keyed by job; node-keyed telemetry is routed to an internal
job-keyed topic with the same partition count, so all of one job's events meet in one worker.
State: each job's engine snapshot lives in a faust table (changelog-backed). The app runs with
``processing_guarantee=exactly_once``: verdicts sent, table updates and consumed offsets commit
together in one Kafka transaction, so a worker killed mid-run and started again resumes from
the changelog and neither misses nor repeats a verdict.
Windows are the engines' own, in event time (faust's windows close on the wall clock and
drop late events, which would make live processing and replay disagree).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import faust
import orjson

from trainguard.bus.config import KafkaConfig
from trainguard.bus.dlq import dead_letter
from trainguard.events.clock import now_us
from trainguard.events.codec import decode, encode
from trainguard.events.errors import ContractError
from trainguard.events.topics import TopicNames, TopicRole
from trainguard.streams.engine import EngineFactory, JobEngine

log = logging.getLogger(__name__)


def telemetry_by_job_topic(names: TopicNames) -> str:
    return f"{names.prefix}.streams.telemetry-by-job"


def build_app(
    cfg: KafkaConfig,
    engines: EngineFactory,
    *,
    partitions: int,
    app_id: str | None = None,
    datadir: Path | None = None,
    web_port: int | None = None,
    batch_size: int = 1000,
    batch_within_s: float = 0.2,
) -> faust.App:
    """``partitions``: the task topic's partition count on the broker; the internal topic and
    the table's changelog get the same, as faust requires of co-partitioned topics."""
    names = TopicNames(cfg.topic_prefix)
    app = faust.App(
        app_id or f"{cfg.topic_prefix}-streams",
        **cfg.faust_broker_kwargs(),
        store="memory://",  # tables are rebuilt from their changelog topics
        processing_guarantee="exactly_once",
        topic_replication_factor=1,
        topic_partitions=partitions,
        web_enabled=web_port is not None,
        web_port=web_port or 6066,
        datadir=str(datadir) if datadir else None,
        consumer_auto_offset_reset="earliest",
        broker_commit_every=500,
        broker_commit_interval=1.0,
        key_serializer="raw",  # also the table's: job ids as bytes, hashed like the records
        value_serializer="raw",
    )
    raw = {"key_serializer": "raw", "value_serializer": "raw"}
    telemetry = app.topic(names.name(TopicRole.TELEMETRY), **raw)
    by_job = app.topic(telemetry_by_job_topic(names), partitions=partitions, **raw)
    verdicts = app.topic(names.name(TopicRole.VERDICTS), **raw)
    dlq = app.topic(names.name(TopicRole.DLQ), **raw)
    # use_partitioner: a job's snapshot goes to the changelog partition its key hashes to,
    # the same partition the job's records are on, whatever event is current in a batch.
    state = app.Table("engine-state", default=None, partitions=partitions, key_type=bytes,
                      value_type=bytes, use_partitioner=True)
    live: dict[str, JobEngine] = {}

    async def refuse(err: ContractError, message: Any, consumer: str) -> None:
        letter = dead_letter(err, topic=message.topic, partition=message.partition,
                             offset=message.offset, key=message.key, value=message.value or b"",
                             rejected_at=now_us(), consumer=consumer)
        await dlq.send(key=message.key, value=letter.encode())

    @app.agent(telemetry, name="route-telemetry")
    async def route(stream: Any) -> None:
        async for ev in stream.events():
            try:
                event = decode(ev.value)
            except ContractError as err:
                await refuse(err, ev.message, "streams.route")
                continue
            await by_job.send(key=event.job_id.encode(), value=ev.value)

    @app.agent(app.topic(names.name(TopicRole.TASK), telemetry_by_job_topic(names), **raw),
               name="evaluate")
    async def evaluate(stream: Any) -> None:
        # Batches: each job's snapshot is written once per batch, not once per event; the
        # batch's offsets, verdicts and snapshots still commit in one transaction.
        async for batch in stream.take_events(batch_size, within=batch_within_s):
            touched: dict[str, JobEngine] = {}
            for ev in batch:
                try:
                    event = decode(ev.value)
                except ContractError as err:
                    await refuse(err, ev.message, "streams.evaluate")
                    continue
                engine = live.get(event.job_id)
                if engine is None:
                    saved = state.get(event.job_id.encode())
                    engine = engines(event.job_id, orjson.loads(saved) if saved else None)
                    live[event.job_id] = engine
                for verdict in engine.feed(event):
                    await verdicts.send(key=event.job_id.encode(), value=encode(verdict))
                touched[event.job_id] = engine
            for job, engine in touched.items():
                state[job.encode()] = orjson.dumps(engine.snapshot())

    @app.on_rebalance_complete.connect
    async def forget(sender: Any, **kwargs: Any) -> None:
        # Another worker may have moved a job's state on; re-read it from the table.
        live.clear()

    del route, evaluate, forget  # registered on the app by their decorators
    return app
