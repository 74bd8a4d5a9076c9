"""docker-compose.yml cannot run here; check what can be checked without Docker (the stack it
describes runs as plain processes in tests/integration/test_compose_stack.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft201909Validator  # type: ignore[import-untyped,unused-ignore]

from trainguard.actuators import signing
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


SCHEMA = ROOT / "tests" / "data" / "compose-spec" / "compose-spec.json"


def _validator() -> Draft201909Validator:
    schema = json.loads(SCHEMA.read_text())
    Draft201909Validator.check_schema(schema)
    return Draft201909Validator(schema)


def test_the_compose_file_follows_the_compose_spec_schema() -> None:
    """The public compose-spec JSON schema (vendored with its licence, SOURCE.md)."""
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in _validator().iter_errors(_compose())]
    assert not errors, errors


def test_the_schema_check_catches_a_misspelled_key() -> None:
    doc = _compose()
    doc["services"]["kafka"]["enviroment"] = doc["services"]["kafka"].pop("environment")
    doc["services"]["decide"]["depends_on"]["kafka"]["condition"] = "service_ready"
    paths = {".".join(map(str, e.absolute_path)) for e in _validator().iter_errors(doc)}
    assert {"services.kafka", "services.decide.depends_on"} <= paths, paths


def test_the_secrets_are_the_files_keys_gen_writes() -> None:
    """`docker compose --profile setup run --rm keys` (or `trainguard keys gen DIR`) makes
    every secret file the services mount, in the directory compose reads them from."""
    keys = _compose()["services"]["keys"]
    assert keys["profiles"] == ["setup"] and keys["command"][:2] == ["keys", "gen"]
    source, target = keys["volumes"][0].rsplit(":", 1)
    assert keys["command"][2] == target
    written = {signing.COMMAND_KEY, signing.COMMAND_PUB, signing.ACTUATOR_KEY,
               signing.ACTUATOR_PUBS}
    files = {s["file"] for s in _compose()["secrets"].values()}
    assert files == {f"{source}/{name}" for name in written}


def test_the_alerts_service_gets_every_secret_its_config_reads() -> None:
    svc = _compose()["services"]["alerts"]
    config = next(v.split(":")[0] for v in svc["volumes"] if v.endswith("/alerts.yml:ro"))
    doc = yaml.safe_load((ROOT / config).read_text())
    refs = [v for ch in doc["channels"] for v in ch.values() if isinstance(v, dict)]
    for ref in refs:
        if "env" in ref:
            assert ref["env"] in svc["environment"], ref
        if "file" in ref:
            assert ref["file"].removeprefix("/run/secrets/") in svc.get("secrets", []), ref


def test_host_network_services_reach_a_published_kafka_listener() -> None:
    """The agent and the actuator share the host's network: their bootstrap must be a
    listener Kafka advertises under that name and publishes on the host."""
    compose = _compose()
    kafka = compose["services"]["kafka"]
    advertised = kafka["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")
    published = {int(p.split(":")[-2]) for p in kafka["ports"]}
    for name, svc in compose["services"].items():
        if svc.get("network_mode") != "host" or "environment" not in svc:
            continue
        bootstrap = svc["environment"]["TRAINGUARD_KAFKA_BOOTSTRAP"]
        host, port = bootstrap.rsplit(":", 1)
        assert int(port) in published, (name, bootstrap)
        assert any(a.endswith(f"{host}:{port}") or a.endswith(f":-{host}}}:{port}")
                   for a in advertised), (name, bootstrap, advertised)


def test_the_image_has_what_the_launched_job_imports() -> None:
    """The actuator launches deploy/actuator/job.yaml from the image: torch needs the
    workload extra installed there."""
    spec = yaml.safe_load((ROOT / "deploy" / "actuator" / "job.yaml").read_text())
    assert "trainguard.workload.ddp" in spec["command"]
    installs = [ln for ln in (ROOT / "Dockerfile").read_text().splitlines()
                if "pip install" in ln]
    assert any('".[workload]"' in ln or "'.[workload]'" in ln for ln in installs), installs


def test_scraped_services_listen_beyond_loopback() -> None:
    """Prometheus (its own container) scrapes decide, the actuator, alerts, metrics and the
    agent: each must bind its metrics port on every interface."""
    for name in ("agent", "decide", "actuator", "alerts", "metrics"):
        command = _compose()["services"][name]["command"]
        addrs = [command[i + 1] for i, arg in enumerate(command)
                 if arg == "--metrics-addr"]
        assert addrs == ["0.0.0.0"], name
