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
