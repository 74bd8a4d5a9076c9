"""Replication settings: from the environment to topics, faust changelogs and the brokers'
own config; the cluster's node configs (no broker: tests/integration/test_kafka_cluster.py
runs the real 3-node cluster)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.bus.config import KafkaConfig, KafkaConfigError
from trainguard.dev.cluster import ClusterInfo, KafkaCluster, NodeInfo
from trainguard.dev.kafka import BrokerError, server_properties


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines())


def test_single_broker_keeps_one_replica() -> None:
    cfg = KafkaConfig.from_env({})
    assert (cfg.replication_factor, cfg.min_insync_replicas) == (1, 1)
    props = _props(server_properties(Path("/d"), 9092, 9093))
    assert props["node.id"] == "1" and props["controller.quorum.voters"] == "1@127.0.0.1:9093"
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor",
                "default.replication.factor", "min.insync.replicas",
                "transaction.state.log.min.isr"):
        assert props[key] == "1", key
    assert "broker.session.timeout.ms" not in props  # Kafka's default on the single broker


def test_replication_comes_from_the_environment_and_is_checked() -> None:
    cfg = KafkaConfig.from_env({"TRAINGUARD_KAFKA_REPLICATION_FACTOR": "3",
                                "TRAINGUARD_KAFKA_MIN_INSYNC_REPLICAS": "2"})
    assert (cfg.replication_factor, cfg.min_insync_replicas) == (3, 2)
    with pytest.raises(KafkaConfigError, match=r"MIN_INSYNC_REPLICAS.*factor 1 \(got 2\)"):
        KafkaConfig.from_env({"TRAINGUARD_KAFKA_MIN_INSYNC_REPLICAS": "2"})
    for bad in ("0", "-1", "three", "1.5"):
        with pytest.raises(KafkaConfigError, match=f"REPLICATION_FACTOR.*{bad!r}"):
            KafkaConfig.from_env({"TRAINGUARD_KAFKA_REPLICATION_FACTOR": bad})


def test_a_cluster_node_config_replicates_everything() -> None:
    voters = "1@127.0.0.1:1,2@127.0.0.1:2,3@127.0.0.1:3"
    props = _props(server_properties(Path("/d"), 9092, 2, node_id=2, voters=voters,
                                     replication=3, min_insync=2, session_timeout_ms=4000))
    assert props["broker.session.timeout.ms"] == "4000"
    assert int(props["broker.heartbeat.interval.ms"]) < 4000 // 2
    assert (props["node.id"], props["controller.quorum.voters"]) == ("2", voters)
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["transaction.state.log.replication.factor"] == "3"
    assert props["default.replication.factor"] == "3"
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"


def test_cluster_info_round_trips_and_gives_clients_its_replication(tmp_path: Path) -> None:
    info = ClusterInfo(nodes=tuple(NodeInfo(i, 100 + i, 9000 + i, 9100 + i) for i in (1, 2, 3)),
                       state_dir=str(tmp_path), started_at=1.0, replication_factor=3,
                       min_insync_replicas=2)
    import json
    from dataclasses import asdict

    assert ClusterInfo.from_json(json.dumps(asdict(info))) == info
    assert info.bootstrap == "127.0.0.1:9001,127.0.0.1:9002,127.0.0.1:9003"
    cfg = KafkaConfig.from_env(info.client_env("t1"))
    assert cfg == info.client_config(topic_prefix="t1")
    assert (cfg.replication_factor, cfg.min_insync_replicas, cfg.bootstrap) \
        == (3, 2, info.bootstrap)


def test_cluster_sizes_and_min_insync_defaults(tmp_path: Path) -> None:
    assert KafkaCluster(tmp_path, size=3).min_insync == 2
    assert KafkaCluster(tmp_path, size=5).min_insync == 2
    assert KafkaCluster(tmp_path, size=1).min_insync == 1
    with pytest.raises(BrokerError, match="between 1 and 3"):
        KafkaCluster(tmp_path, size=3, min_insync=4)


def test_faust_changelogs_get_the_configured_replication() -> None:
    from trainguard.rules import engine_factory, load_default_rules
    from trainguard.streams.app import build_app

    cfg = KafkaConfig(replication_factor=3, min_insync_replicas=2, topic_prefix="t1")
    app = build_app(cfg, engine_factory(load_default_rules(), prompt=True), partitions=3)
    assert app.conf.topic_replication_factor == 3
    (table,) = app.tables.values()
    changelog = table.changelog_topic
    assert changelog.replicas in (None, 3)  # None: the app's factor
    assert changelog.config["min.insync.replicas"] == "2"
