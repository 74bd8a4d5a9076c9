"""The secured dev broker (`dev kafka start --secure`): SASL_SSL/SCRAM principals and the ACLs
derived from the topic registry, enforced by the real Kafka broker.

- a wrong-principal write (the agent producing a command) is refused by the broker, the right
  principal's write is accepted and readable;
- a client without credentials, one with a wrong password and one with the right password
  but without TLS are refused;
- the streams worker (faust, exactly-once) runs under its own principal: agent-produced records
  in, verdicts out, read back by the read-only operator principal.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaError, TopicAuthorizationFailedError

from tests.integration.conftest import arun, read_events
from trainguard.bus.acl import ADMIN_USER
from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.bus.producer import EventProducer
from trainguard.dev.kafka import BrokerInfo, KafkaBroker
from trainguard.events.clock import now_us
from trainguard.events.payloads import NodeHealthKind, Verdict
from trainguard.events.topics import TOPIC_SPECS, Service, TopicNames, TopicRole
from trainguard.rules import synth


@pytest.fixture(scope="module")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerInfo]:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka-secure"))
    try:
        info = broker.start(fresh=True, secure=True, timeout_s=120)
    except Exception as exc:
        pytest.fail(f"the secured Kafka broker could not start: {exc}", pytrace=False)
    try:
        yield info
    finally:
        broker.stop()


@pytest.fixture
def prefix(secure_broker: BrokerInfo) -> str:
    """A fresh prefix with its topics (created by the admin) and its ACLs."""
    prefix = f"s{uuid.uuid4().hex[:10]}"
    admin = secure_broker.client_config(ADMIN_USER, topic_prefix=prefix)
    arun(ensure_topics(admin, TopicNames(prefix), partitions={s.role: 3 for s in TOPIC_SPECS}))
    KafkaBroker(Path(secure_broker.state_dir)).grant(prefix)
    return prefix


async def _produce(info: BrokerInfo, user: Service, topic: str) -> int:
    cfg = info.client_config(user)
    producer = AIOKafkaProducer(**cfg.client_kwargs(), acks="all", enable_idempotence=True,
                                request_timeout_ms=10_000)
    await producer.start()
    try:
        meta = await producer.send_and_wait(topic, b"probe", key=b"job-1")
        return int(meta.offset)
    finally:
        await producer.stop()


def test_the_broker_refuses_a_wrong_principal_write_and_accepts_the_right_one(
        secure_broker: BrokerInfo, prefix: str) -> None:
    names = TopicNames(prefix)
    commands, telemetry = names.name(TopicRole.COMMANDS), names.name(TopicRole.TELEMETRY)
    with pytest.raises(TopicAuthorizationFailedError):
        arun(_produce(secure_broker, Service.AGENT, commands))      # agents never command
    with pytest.raises(TopicAuthorizationFailedError):
        arun(_produce(secure_broker, Service.STREAMS, commands))
    with pytest.raises(TopicAuthorizationFailedError):
        arun(_produce(secure_broker, Service.DECIDE, telemetry))    # decide never reports
    assert arun(_produce(secure_broker, Service.DECIDE, commands)) == 0
    assert arun(_produce(secure_broker, Service.AGENT, telemetry)) >= 0
    # Every consumer may dead-letter; the read-only operator may not write anything else.
    assert arun(_produce(secure_broker, Service.ALERTS, names.name(TopicRole.DLQ))) >= 0
    with pytest.raises(TopicAuthorizationFailedError):
        arun(_produce(secure_broker, Service.OPERATOR, names.name(TopicRole.TASK)))


def test_clients_without_valid_credentials_are_refused(secure_broker: BrokerInfo,
                                                       prefix: str) -> None:
    topic = TopicNames(prefix).name(TopicRole.TELEMETRY)

    async def plaintext() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=secure_broker.bootstrap,
                                    request_timeout_ms=3000)
        try:
            await producer.start()
            await producer.send_and_wait(topic, b"anonymous")
        finally:
            await producer.stop()

    with pytest.raises(KafkaConnectionError):
        arun(plaintext(), timeout_s=30)

    async def wrong_password() -> None:
        cfg = replace(secure_broker.client_config(Service.AGENT), sasl_password="guess")
        producer = AIOKafkaProducer(**cfg.client_kwargs(), request_timeout_ms=3000)
        try:
            await producer.start()
            await producer.send_and_wait(topic, b"guessed")
        finally:
            await producer.stop()

    with pytest.raises(KafkaError):
        arun(wrong_password(), timeout_s=30)

    async def right_password_without_tls() -> None:
        cfg = replace(secure_broker.client_config(Service.AGENT),
                      security_protocol="SASL_PLAINTEXT")
        producer = AIOKafkaProducer(**cfg.client_kwargs(), request_timeout_ms=3000)
        try:
            await producer.start()
            await producer.send_and_wait(topic, b"in the clear")
        finally:
            await producer.stop()

    with pytest.raises(KafkaError):
        arun(right_password_without_tls(), timeout_s=30)
    # Nothing of either reached the topic.
    operator = secure_broker.client_config(Service.OPERATOR, topic_prefix=prefix)
    assert read_events(operator, [TopicRole.TELEMETRY], idle_ms=500, limit_s=10) == []


def test_the_streams_worker_runs_under_its_own_principal(secure_broker: BrokerInfo,
                                                         prefix: str, tmp_path: Path) -> None:
    job = "job-secure"
    t0 = now_us()
    events = [synth.telemetry(job, f"node-{i % 3}", t0 + i * 1000, i) for i in range(6)]
    events.append(synth.node_health(job, "node-1", NodeHealthKind.XID, t0 + 6_500, code=79,
                                    gpu=3))
    env = {**os.environ, **secure_broker.client_env(Service.STREAMS, prefix)}
    worker = subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli.main", "streams", "--data-dir", str(tmp_path)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        async def publish() -> None:
            agent = secure_broker.client_config(Service.AGENT, topic_prefix=prefix)
            async with EventProducer(agent) as producer:
                await asyncio.gather(*[await producer.enqueue(ev) for ev in events])

        arun(publish())
        operator = secure_broker.client_config(Service.OPERATOR, topic_prefix=prefix)
        got: list[Verdict] = []
        for _ in range(30):
            got = [e.payload for e in read_events(operator, [TopicRole.VERDICTS], idle_ms=1000,
                                                  limit_s=10) if isinstance(e.payload, Verdict)]
            if got or worker.poll() is not None:
                break
        assert worker.poll() is None, f"the worker exited: {_stderr(worker)}"
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
    assert [(v.kind, v.state) for v in got] == [("xid_drain", "open")], _stderr(worker)
    # ... sent inside the worker's own transactions (faust only logs a warning when it may
    # not open one, and then sends without: the broker's transaction log must know them).
    admin = secure_broker.client_config(ADMIN_USER)
    assert f"{prefix}-streams-".encode() in arun(_transaction_log_keys(admin))


async def _transaction_log_keys(admin: KafkaConfig) -> bytes:
    """Every key of the broker's transaction log, concatenated (the super user may read it)."""
    consumer = AIOKafkaConsumer(**admin.client_kwargs(), group_id=None,
                                enable_auto_commit=False)
    await consumer.start()
    try:
        parts = [TopicPartition("__transaction_state", p)
                 for p in consumer.partitions_for_topic("__transaction_state") or ()]
        if not parts:
            await consumer._client.force_metadata_update()
            parts = [TopicPartition("__transaction_state", p)
                     for p in consumer.partitions_for_topic("__transaction_state") or ()]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        ends = await consumer.end_offsets(parts)
        keys = b""
        pending = {tp for tp in parts if ends[tp] > 0}
        while pending:
            for tp, records in (await consumer.getmany(*pending, timeout_ms=1000)).items():
                keys += b"".join(r.key or b"" for r in records)
                if records and records[-1].offset + 1 >= ends[tp]:
                    pending.discard(tp)
        return keys
    finally:
        await consumer.stop()


def _stderr(proc: subprocess.Popen[bytes]) -> str:
    if proc.poll() is None or proc.stderr is None:
        return ""
    return proc.stderr.read().decode(errors="replace")[-2000:]


def test_a_streams_worker_outside_its_own_names_stops_with_one_line(
        secure_broker: BrokerInfo, prefix: str, tmp_path: Path) -> None:
    # An app id the ACLs do not give to `streams`: faust would run without transactions
    # (it only logs a warning); the worker refuses to start instead.
    env = {**os.environ, **secure_broker.client_env(Service.STREAMS, prefix)}
    proc = subprocess.run(
        [sys.executable, "-m", "trainguard.cli.main", "streams", "--data-dir", str(tmp_path),
         "--app-id", f"{prefix}-elsewhere"],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    # log lines (a timestamp first, e.g. "no trusted actuator keys") are not the error line
    lines = [line for line in proc.stderr.strip().splitlines()
             if not re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", line)]
    assert len(lines) == 1 and "TransactionalIdAuthorizationFailed" in lines[0], lines
    assert f"{prefix}-elsewhere-preflight" in lines[0]
