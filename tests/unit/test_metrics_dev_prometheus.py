"""trainguard/dev/prometheus.py without starting anything: the config it writes, and a missing
binary named as an error (the tests that need Prometheus fail, never skip)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainguard.dev.prometheus import PrometheusError, find_binary, scrape_config


def test_scrape_config_scrapes_each_target_at_the_interval() -> None:
    cfg = scrape_config({"trainguard-metrics": ["127.0.0.1:9402"],
                         "trainguard-agent": ["127.0.0.1:9401", "127.0.0.1:9411"]},
                        interval="1s", rule_files=[Path("/r/a.yml")])
    assert cfg["global"]["scrape_interval"] == "1s"
    assert cfg["rule_files"] == ["/r/a.yml"]
    jobs = {c["job_name"]: c["static_configs"][0]["targets"] for c in cfg["scrape_configs"]}
    assert jobs == {"trainguard-metrics": ["127.0.0.1:9402"],
                    "trainguard-agent": ["127.0.0.1:9401", "127.0.0.1:9411"]}


def test_a_missing_binary_is_an_error_naming_the_package(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(PrometheusError, match="apt-get install prometheus"):
        find_binary("no-such-prometheus-binary")
