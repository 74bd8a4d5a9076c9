"""A real Prometheus (Debian's /usr/bin/prometheus) as a local process, for tests and development.

``PrometheusServer.start`` writes a config scraping the given targets (short interval), keeps the
TSDB in a temporary directory, listens on a free loopback port and waits until ready; ``query``
evaluates PromQL through the HTTP API. ``promtool_check_rules`` runs ``promtool check rules``.
A missing binary is an error naming what to install, never a silent skip.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainguard.dev.kafka import free_port
from trainguard.dev.ready import wait_ready


class PrometheusError(RuntimeError):
    pass


def find_binary(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists()
                                  else None)
    if path is None:
        raise PrometheusError(f"{name} not found on PATH or in /usr/bin: install Debian's "
                              "'prometheus' package (apt-get install prometheus)")
    return path


def promtool_check_rules(files: Sequence[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_binary("promtool"), "check", "rules", *map(str, files)],
                          capture_output=True, text=True, timeout=60, check=False)


def scrape_config(targets: Mapping[str, Sequence[str]], *, interval: str = "1s",
                  rule_files: Sequence[Path] = (),
                  job_settings: Mapping[str, Mapping[str, Any]] | None = None
                  ) -> dict[str, Any]:
    """``job_settings``: more keys for a scrape job (e.g. the ``metric_relabel_configs`` the
    deployed config gives it)."""
    settings = job_settings or {}
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval,
                   "scrape_timeout": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(addrs)}],
                            **settings.get(job, {})}
                           for job, addrs in targets.items()],
    }


def deployed_job(config: Path, job: str) -> dict[str, Any]:
    """A scrape job's settings from a deployed prometheus.yml, less its name and targets."""
    doc = yaml.safe_load(config.read_text())
    for entry in doc.get("scrape_configs", []):
        if entry.get("job_name") == job:
            return {k: v for k, v in entry.items() if k not in ("job_name", "static_configs")}
    raise PrometheusError(f"{config}: no scrape job {job!r}")


@dataclass
class PrometheusServer:
    root: Path | None = None
    port: int = 0
    _proc: subprocess.Popen[bytes] | None = None
    _tmp: tempfile.TemporaryDirectory[str] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, targets: Mapping[str, Sequence[str]], *, interval: str = "1s",
              rule_files: Sequence[Path] = (), timeout_s: float = 30.0,
              job_settings: Mapping[str, Mapping[str, Any]] | None = None) -> str:
        binary = find_binary("prometheus")
        if self.root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="tg-prometheus-")
            self.root = Path(self._tmp.name)
        config = self.root / "prometheus.yml"
        config.write_text(yaml.safe_dump(scrape_config(targets, interval=interval,
                                                       rule_files=rule_files,
                                                       job_settings=job_settings)))
        self.port = self.port or free_port()
        log = (self.root / "prometheus.log").open("wb")
        self._proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={self.root / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        problem = wait_ready(self.url, self._proc, timeout_s, poll_s=0.2)
        if problem is not None:
            raise PrometheusError(f"prometheus {problem}: {self.log_tail()}")
        return self.url

    def log_tail(self, chars: int = 2000) -> str:
        path = self.root / "prometheus.log" if self.root else None
        return path.read_text(errors="replace")[-chars:] if path and path.exists() else ""

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            body = json.loads(err.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: "
                                  f"{body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's result (the vector's samples, or one scalar as a sample)."""
        data = self.api("query", query=expr)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def targets_up(self) -> dict[str, bool]:
        """scrape URL -> whether its last scrape succeeded."""
        active = self.api("targets")["activeTargets"]
        return {t["scrapeUrl"]: t["health"] == "up" for t in active}

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self.root = None
