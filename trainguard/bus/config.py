"""How every trainguard service reaches Kafka, security included.

Read from the environment (``TRAINGUARD_KAFKA_*``) so that each service, container or test gets
its settings the same way; secrets come from files or the environment, never from a topic.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


class KafkaConfigError(ValueError):
    pass


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap: str = "127.0.0.1:9092"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    topic_prefix: str = "tg"
    client_id: str = "trainguard"
    # How many copies of every topic (changelogs included) and how many must have a record
    # before an acks=all producer is answered: 1/1 on the single dev broker, 3/2 on a cluster.
    replication_factor: int = 1
    min_insync_replicas: int = 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> KafkaConfig:
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            return env.get(f"TRAINGUARD_KAFKA_{name}") or None

        password = get("SASL_PASSWORD")
        password_file = get("SASL_PASSWORD_FILE")
        if password_file:
            try:
                with open(password_file, encoding="utf-8") as fh:
                    password = fh.read().strip()
            except (OSError, UnicodeDecodeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
                raise KafkaConfigError(f"TRAINGUARD_KAFKA_SASL_PASSWORD_FILE: {password_file}: "
                                       f"cannot read it ({why})") from None
        protocol = (get("SECURITY_PROTOCOL") or "PLAINTEXT").upper()
        if protocol not in _PROTOCOLS:
            raise KafkaConfigError(
                "TRAINGUARD_KAFKA_SECURITY_PROTOCOL: must be one of "
                f"{_PROTOCOLS} (got {protocol!r})"
            )
        values: dict[str, Any] = {
            "bootstrap": get("BOOTSTRAP") or cls.bootstrap,
            "security_protocol": protocol,
            "sasl_mechanism": get("SASL_MECHANISM"),
            "sasl_username": get("SASL_USERNAME"),
            "sasl_password": password,
            "ssl_cafile": get("SSL_CAFILE"),
            "ssl_certfile": get("SSL_CERTFILE"),
            "ssl_keyfile": get("SSL_KEYFILE"),
            "topic_prefix": get("TOPIC_PREFIX") or cls.topic_prefix,
            "replication_factor": _positive(get("REPLICATION_FACTOR"), "REPLICATION_FACTOR",
                                            cls.replication_factor),
            "min_insync_replicas": _positive(get("MIN_INSYNC_REPLICAS"), "MIN_INSYNC_REPLICAS",
                                             cls.min_insync_replicas),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if not 1 <= self.min_insync_replicas <= self.replication_factor:
            raise KafkaConfigError(
                "TRAINGUARD_KAFKA_MIN_INSYNC_REPLICAS: must be between 1 and the replication "
                f"factor {self.replication_factor} (got {self.min_insync_replicas})")
        if self.security_protocol.startswith("SASL"):
            if self.sasl_mechanism not in _SASL:
                raise KafkaConfigError(
                    f"TRAINGUARD_KAFKA_SASL_MECHANISM: must be one of {_SASL} "
                    f"(got {self.sasl_mechanism!r})"
                )
            if not self.sasl_username or not self.sasl_password:
                raise KafkaConfigError(
                    "TRAINGUARD_KAFKA_SASL_USERNAME/SASL_PASSWORD(_FILE): required for "
                    f"{self.security_protocol}"
                )

    def __repr__(self) -> str:  # never print the password
        shown = "***" if self.sasl_password else None
        return (f"KafkaConfig(bootstrap={self.bootstrap!r}, "
                f"security_protocol={self.security_protocol!r}, "
                f"sasl_mechanism={self.sasl_mechanism!r}, sasl_username={self.sasl_username!r}, "
                f"sasl_password={shown!r}, topic_prefix={self.topic_prefix!r}, "
                f"replication_factor={self.replication_factor}, "
                f"min_insync_replicas={self.min_insync_replicas})")

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments shared by aiokafka producers, consumers and admin clients."""
        kw: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "security_protocol": self.security_protocol,
            "client_id": self.client_id,
        }
        if self.security_protocol in ("SSL", "SASL_SSL"):
            ctx = ssl.create_default_context(cafile=self.ssl_cafile)
            if self.ssl_certfile:
                ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
            kw["ssl_context"] = ctx
        if self.security_protocol.startswith("SASL"):
            kw["sasl_mechanism"] = self.sasl_mechanism
            kw["sasl_plain_username"] = self.sasl_username
            kw["sasl_plain_password"] = self.sasl_password
        return kw

    def faust_broker_kwargs(self) -> dict[str, Any]:
        """The same settings in the form faust.App takes (broker URL and credentials)."""
        kw: dict[str, Any] = {"broker": f"kafka://{self.bootstrap}"}
        if self.security_protocol == "PLAINTEXT":
            return kw
        import faust

        ctx = None
        if self.security_protocol in ("SSL", "SASL_SSL"):
            ctx = ssl.create_default_context(cafile=self.ssl_cafile)
            if self.ssl_certfile:
                ctx.load_cert_chain(self.ssl_certfile, self.ssl_keyfile)
        if self.security_protocol == "SSL":
            kw["broker_credentials"] = ctx
        else:
            kw["broker_credentials"] = faust.SASLCredentials(
                username=self.sasl_username,
                password=self.sasl_password,
                mechanism=self.sasl_mechanism,
                ssl_context=ctx,
            )
        return kw


def _positive(raw: str | None, name: str, default: int) -> int:
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise KafkaConfigError(f"TRAINGUARD_KAFKA_{name}: must be a whole number >= 1 "
                               f"(got {raw!r})")
    return value
