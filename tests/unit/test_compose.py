"""docker-compose.yml cannot run here; check what can be checked without Docker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return doc


def _trainguard_services() -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in _compose()["services"].items()
            if svc.get("image", "").startswith("trainguard")}


def test_compose_has_the_production_services() -> None:
    services = _compose()["services"]
    for needed in ("kafka", "prometheus", "alertmanager", "grafana", "topics-init"):
        assert needed in services
    assert services["kafka"]["image"].startswith("apache/kafka:3.9")
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"


@pytest.mark.parametrize("name", sorted(_trainguard_services()))
def test_every_service_command_is_a_real_subcommand(name: str) -> None:
    svc = _trainguard_services()[name]
    command = svc["command"]
    assert isinstance(command, list) and command
    args = build_parser().parse_args(command)  # SystemExit (a failure) if it is not one
    assert callable(args.func)


def test_every_mounted_config_file_exists() -> None:
    mounts = [v for svc in _compose()["services"].values() for v in svc.get("volumes", [])]
    local = [m.split(":")[0] for m in mounts if m.startswith("./")]
    assert local, "expected bind-mounted configs"
    for path in local:
        assert (ROOT / path).exists(), path


def test_the_image_builds_from_files_that_exist() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    for line in dockerfile.splitlines():
        if line.startswith("COPY"):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), src


def test_keys_go_where_the_trust_model_says() -> None:
    """docs/security.md: decide alone holds the command private key, actuators alone an
    actuator private key; every key file a service is pointed at is a secret it mounts."""
    services = _trainguard_services()
    holders = {name: set(svc.get("secrets", [])) for name, svc in services.items()}
    assert [n for n, s in holders.items() if "command-key" in s] == ["decide"]
    assert [n for n, s in holders.items() if "actuator-key" in s] == ["actuator"]
    assert {"command-pubkey", "actuator-pubkeys"} <= holders["actuator"]
    for name in ("decide", "streams", "incidents"):
        assert "actuator-pubkeys" in holders[name], name
    for name, svc in services.items():
        for var, value in (svc.get("environment") or {}).items():
            if var.endswith("_FILE") and str(value).startswith("/run/secrets/"):
                assert value.removeprefix("/run/secrets/") in holders[name], (name, var)
    declared = _compose()["secrets"]
    assert {s for held in holders.values() for s in held} <= set(declared)
