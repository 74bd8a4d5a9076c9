"""The broker's ACLs derived from the topic registry, the secured broker's settings and its
credential files (no broker: the integration tier proves the broker enforces them)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from trainguard.bus.acl import (
    ADMIN_USER,
    PatternType,
    ResourceType,
    acl_bindings,
    may_write,
    principal,
    render_acl_table,
)
from trainguard.bus.config import KafkaConfig
from trainguard.dev.kafka import USERS, BrokerInfo, server_properties, write_passwords
from trainguard.dev.tls import make_tls_files
from trainguard.events.topics import EVENT_ROLES, TOPIC_SPECS, Service, TopicNames, TopicRole

DOC = Path(__file__).resolve().parents[2] / "docs" / "security-broker.md"
P = "tg"
N = TopicNames(P)
# What each service may produce besides the dead-letter topic (the trust model).
OWNS: dict[Service, set[TopicRole]] = {
    Service.AGENT: {TopicRole.TELEMETRY, TopicRole.TASK, TopicRole.URGENT},
    Service.STREAMS: {TopicRole.VERDICTS},
    Service.DECIDE: {TopicRole.COMMANDS},
    Service.ACTUATOR: {TopicRole.OUTCOMES},
    Service.INCIDENTS: {TopicRole.INCIDENTS},
    Service.DRILLS: {TopicRole.DRILLS},
    Service.ALERTS: set(),
    Service.METRICS: set(),
    Service.OPERATOR: set(),
}


def test_docs_security_broker_md_holds_the_generated_acl_table() -> None:
    text = DOC.read_text()
    block = text.split("<!-- acl-table:begin -->\n", 1)[1].split("<!-- acl-table:end -->", 1)[0]
    assert block == render_acl_table(), (
        "docs/security-broker.md is stale: paste render_acl_table() between the markers")


@pytest.mark.parametrize("service", list(Service))
def test_each_service_writes_only_its_own_topics_and_the_dlq(service: Service) -> None:
    allowed = {r for r in TopicRole if may_write(service, N.name(r), P)}
    assert allowed - {TopicRole.DLQ} == OWNS[service]
    reads_events = any(service in s.readers for s in TOPIC_SPECS if s.role in EVENT_ROLES)
    assert (TopicRole.DLQ in allowed) == reads_events  # every consumer may dead-letter


def test_one_writer_per_event_topic() -> None:
    for role in EVENT_ROLES:
        assert len([s for s in Service if may_write(s, N.name(role), P)]) == 1, role


def test_prefixed_rules_reach_only_their_own_names() -> None:
    for b in acl_bindings(P):
        if b.pattern is PatternType.PREFIXED:
            # a prefixed rule never covers a registry topic (`tg.` vs `tg-`) ...
            assert not any(N.name(r).startswith(b.name) for r in TopicRole), b
            # ... and names the principal's own things, but for metrics describing groups
            if (b.principal, b.resource) != (principal(Service.METRICS), ResourceType.GROUP):
                assert b.name == f"{P}-{b.principal.removeprefix('User:')}", b
    # streams owns its faust internals, nobody else writes them
    changelog = f"{P}-streams-engine-state-changelog"
    assert [s for s in Service if may_write(s, changelog, P)] == [Service.STREAMS]
    assert not may_write(Service.STREAMS, f"{P}x-streams-engine-state-changelog", P)


def test_rules_are_per_prefix() -> None:
    assert not may_write(Service.DECIDE, TopicNames("other").name(TopicRole.COMMANDS), P)
    assert may_write(Service.DECIDE, TopicNames("other").name(TopicRole.COMMANDS), "other")


def test_secured_properties_deny_by_default_and_keep_no_plaintext_listener(
        tmp_path: Path) -> None:
    plain = server_properties(tmp_path, 9092, 9093)
    assert "sasl" not in plain and "authorizer" not in plain
    tls = make_tls_files(tmp_path / "tls")
    props = dict(line.split("=", 1) for line in
                 server_properties(tmp_path, 9092, 9093, "pw", tls).splitlines())
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["super.users"] == f"User:{ADMIN_USER}"
    assert props["listener.security.protocol.map"] == "CLIENT:SASL_SSL,CONTROLLER:SASL_SSL"
    assert props["ssl.keystore.location"] == str(tls.keystore)
    assert props["listener.name.client.sasl.enabled.mechanisms"] == "SCRAM-SHA-512"


def test_the_dev_ca_signs_a_broker_certificate_for_the_loopback(tmp_path: Path) -> None:
    import ssl

    from cryptography import x509

    tls = make_tls_files(tmp_path / "tls")
    for path in (tls.ca, tls.keystore):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    pem = tls.keystore.read_bytes()
    assert pem.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, as Kafka's PEM wants
    cert = x509.load_pem_x509_certificates(pem)[0]
    ca = x509.load_pem_x509_certificate(tls.ca.read_bytes())
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    ssl.create_default_context(cafile=str(tls.ca))  # the clients' context loads it


def test_passwords_are_random_and_only_their_owner_reads_them(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    first = write_passwords(creds)
    assert set(first) == set(USERS) == {ADMIN_USER, *(s.value for s in Service)}
    assert len(set(first.values())) == len(USERS)
    assert stat.S_IMODE(creds.stat().st_mode) == 0o700
    for user, password in first.items():
        path = creds / f"{user}.password"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert path.read_text().strip() == password
    assert write_passwords(creds) != first  # a new cluster gets new passwords


def test_a_service_env_gives_the_config_it_connects_with(tmp_path: Path) -> None:
    info = BrokerInfo(pid=1, port=9092, controller_port=9093, state_dir=str(tmp_path),
                      started_at=0.0, secure=True)
    passwords = write_passwords(info.credentials_dir())
    make_tls_files(tmp_path / "tls")
    cfg = KafkaConfig.from_env(info.client_env(Service.DECIDE, "t1"))
    assert (cfg.security_protocol, cfg.sasl_mechanism, cfg.sasl_username, cfg.topic_prefix) \
        == ("SASL_SSL", "SCRAM-SHA-512", "decide", "t1")
    assert cfg.ssl_cafile == str(tmp_path / "tls" / "ca.pem")
    assert cfg.sasl_password == passwords["decide"]
    assert info.client_config(Service.DECIDE) == KafkaConfig(
        bootstrap=info.bootstrap, security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512", sasl_username="decide",
        sasl_password=passwords["decide"], ssl_cafile=cfg.ssl_cafile)
    faust_kw = cfg.faust_broker_kwargs()
    creds = faust_kw["broker_credentials"]
    assert (creds.username, creds.password, creds.mechanism.value, creds.protocol.value) \
        == ("decide", passwords["decide"], "SCRAM-SHA-512", "SASL_SSL")
    plain = BrokerInfo(pid=1, port=9092, controller_port=9093, state_dir=str(tmp_path),
                       started_at=0.0)
    assert "TRAINGUARD_KAFKA_SECURITY_PROTOCOL" not in plain.client_env(Service.DECIDE)
