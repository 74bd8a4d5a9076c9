"""The top-level data folders: rules/ (the rule sets, the default among them) and dashboards/
(the provisioned JSON), each with its README, and the deployment pointing at them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from trainguard.rules.schema import DEFAULT_RULES, default_rules_file, load_rules

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def test_each_folder_has_a_readme() -> None:
    for folder in ("rules", "dashboards"):
        assert (ROOT / folder / "README.md").read_text().startswith(f"# {folder}/")


@pytest.mark.parametrize("path", sorted((ROOT / "rules").glob("*.yaml")), ids=lambda p: p.name)
def test_every_rule_set_loads(path: Path) -> None:
    assert load_rules(path).rules


def test_a_checkout_reads_the_default_from_rules() -> None:
    assert Path(str(default_rules_file())) == ROOT / "rules" / DEFAULT_RULES
    assert not (ROOT / "trainguard" / "rules" / "sets").exists()  # only the wheel has it


def test_grafana_provisions_the_dashboards_folder() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/trainguard.yml")
                              .read_text())["providers"][0]["options"]["path"]
    mounts = dict(v.rsplit(":", 2)[:2] for v in compose["services"]["grafana"]["volumes"])
    assert mounts["./dashboards"] == provider
    assert sorted(p.name for p in (ROOT / "dashboards").glob("*.json"))


def test_the_image_gets_the_rule_sets() -> None:
    copies = [line.split()[1:-1] for line in (ROOT / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY")]
    assert any("rules" in srcs for srcs in copies) and any("setup.py" in s for s in copies)
