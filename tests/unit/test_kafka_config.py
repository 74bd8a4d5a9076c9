from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.bus.config import KafkaConfig, KafkaConfigError
from trainguard.bus.producer import PRODUCER_SETTINGS


def test_defaults_and_env() -> None:
    cfg = KafkaConfig.from_env({"TRAINGUARD_KAFKA_BOOTSTRAP": "k:1",
                                "TRAINGUARD_KAFKA_TOPIC_PREFIX": "x"})
    assert cfg.bootstrap == "k:1" and cfg.topic_prefix == "x"
    assert cfg.client_kwargs()["security_protocol"] == "PLAINTEXT"


def test_sasl_needs_mechanism_and_credentials_and_hides_the_password(tmp_path: Path) -> None:
    with pytest.raises(KafkaConfigError, match="SASL_MECHANISM"):
        KafkaConfig.from_env({"TRAINGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"})
    with pytest.raises(KafkaConfigError, match="SASL_USERNAME"):
        KafkaConfig.from_env({"TRAINGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                              "TRAINGUARD_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512"})
    secret = tmp_path / "pw"
    secret.write_text("s3cr3t\n")
    cfg = KafkaConfig.from_env({"TRAINGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                                "TRAINGUARD_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
                                "TRAINGUARD_KAFKA_SASL_USERNAME": "svc",
                                "TRAINGUARD_KAFKA_SASL_PASSWORD_FILE": str(secret)})
    kw = cfg.client_kwargs()
    assert kw["sasl_plain_password"] == "s3cr3t" and kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert "s3cr3t" not in repr(cfg)


def test_unknown_protocol_is_named() -> None:
    with pytest.raises(KafkaConfigError, match=r"SECURITY_PROTOCOL.*'TLS'"):
        KafkaConfig.from_env({"TRAINGUARD_KAFKA_SECURITY_PROTOCOL": "tls"})


def test_producers_wait_for_all_replicas_with_idempotence() -> None:
    assert PRODUCER_SETTINGS["acks"] == "all"
    assert PRODUCER_SETTINGS["enable_idempotence"] is True


def test_an_unreadable_password_file_is_one_line(tmp_path: Path) -> None:
    base = {"TRAINGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "TRAINGUARD_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "TRAINGUARD_KAFKA_SASL_USERNAME": "svc"}
    for path in (tmp_path / "missing", tmp_path):
        with pytest.raises(KafkaConfigError, match=f"PASSWORD_FILE: {path}: cannot read"):
            KafkaConfig.from_env({**base, "TRAINGUARD_KAFKA_SASL_PASSWORD_FILE": str(path)})
    bad = tmp_path / "bad"
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(KafkaConfigError, match="not UTF-8"):
        KafkaConfig.from_env({**base, "TRAINGUARD_KAFKA_SASL_PASSWORD_FILE": str(bad)})
