"""The one mapping from docker-compose.yml's world to plain processes here
(tests/integration/compose_stack.py), checked on the real compose file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.compose_stack import (
    ComposeError,
    Translation,
    interpolate,
    kafka_properties,
    load,
)

pytestmark = pytest.mark.unit


def test_interpolation_follows_compose() -> None:
    env = {"SET": "v", "EMPTY": ""}
    assert interpolate("${SET:-d} ${UNSET:-d} ${EMPTY:-d} ${EMPTY-d} $$x $SET", env) == \
        "v d d  $x v"
    assert interpolate({"a": ["${UNSET}", 3]}, env) == {"a": ["", 3]}
    with pytest.raises(ComposeError, match="UNSET"):
        interpolate("${UNSET:?say why}", env)


def test_kafka_variables_become_the_images_properties() -> None:
    props = kafka_properties({"KAFKA_LOG_DIRS": "/d", "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "x",
                              "KAFKA_A__B": "1", "KAFKA_C___D": "2", "OTHER": "3"})
    assert props == {"log.dirs": "/d", "listener.security.protocol.map": "x", "a_b": "1",
                     "c-d": "2"}


def test_addresses_resolve_from_each_services_point_of_view(tmp_path: Path) -> None:
    tr = Translation(load({"TRAINGUARD_KEYS_DIR": str(tmp_path / "keys")}), tmp_path)
    kafka = tr.kafka("kafka")
    listeners = dict(item.split("://") for item in kafka["listeners"].split(","))
    advertised = dict(item.split("://") for item in kafka["advertised.listeners"].split(","))
    # the host-network agent's bootstrap is the EXTERNAL listener, through the published port
    assert tr.env("agent")["TRAINGUARD_KAFKA_BOOTSTRAP"] == advertised["EXTERNAL"]
    assert advertised["EXTERNAL"].endswith(listeners["EXTERNAL"])  # bind-all, same port
    assert listeners["EXTERNAL"].startswith(":")
    # compose's network: kafka:9092 is the PLAINTEXT listener
    assert tr.env("decide")["TRAINGUARD_KAFKA_BOOTSTRAP"] == advertised["PLAINTEXT"]
    assert advertised["PLAINTEXT"] != advertised["EXTERNAL"]
    # the controller and Alertmanager share a port number, in two namespaces: two ports here
    voters = kafka["controller.quorum.voters"]
    assert voters.startswith("1@127.0.0.1:")
    assert tr.address("alerts", "http://alertmanager:9093") != \
        f"http://127.0.0.1:{voters.rsplit(':', 1)[1]}"
    # log.dirs on the kafka-data volume; secrets at their /run/secrets paths
    assert kafka["log.dirs"] == str(tmp_path / "volumes" / "kafka-data")
    assert tr.env("decide")["TRAINGUARD_COMMAND_KEY_FILE"] == \
        str(tmp_path / "keys" / "command.key")
    # a --metrics-port and a bind-all address: a free port, still bind-all
    argv = tr.argv("decide")
    port = argv[argv.index("--metrics-port") + 1]
    assert port != "9403" and argv[argv.index("--metrics-addr") + 1] == "0.0.0.0"
    assert tr.address("prometheus", "decide:9403") == f"127.0.0.1:{port}"
