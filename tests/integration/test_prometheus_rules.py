"""Alert rules and the Prometheus config, checked by Debian's promtool (never skipped)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from trainguard.dev.prometheus import find_binary, promtool_check_rules

ROOT = Path(__file__).resolve().parents[2]
RULES = sorted((ROOT / "deploy/prometheus/rules").glob("*.yml"))


def test_alert_rules_pass_promtool_check_rules() -> None:
    assert RULES, "no rule files in deploy/prometheus/rules"
    result = promtool_check_rules(RULES)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_alerts_fire_on_bad_series_and_stay_quiet_on_good_ones() -> None:
    tests = ROOT / "deploy/prometheus/tests/trainguard-rules.test.yml"
    result = subprocess.run([find_binary("promtool"), "test", "rules", str(tests)],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_rule_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: rate(\n")
    assert promtool_check_rules([bad]).returncode != 0


def test_the_deployed_prometheus_config_is_valid() -> None:
    result = subprocess.run([find_binary("promtool"), "check", "config",
                             str(ROOT / "deploy/prometheus/prometheus.yml")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
