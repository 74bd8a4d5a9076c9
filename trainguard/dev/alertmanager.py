"""A real Prometheus Alertmanager (Debian's ``prometheus-alertmanager``) as a local process, for
tests and development: a free port on 127.0.0.1, clustering off, state in a directory of its
own, and a config that routes every alert to one webhook with short group timers."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from trainguard.dev.kafka import free_port
from trainguard.dev.ready import wait_ready

CANDIDATES = ("prometheus-alertmanager", "alertmanager")


class AlertmanagerError(RuntimeError):
    pass


def find_binary() -> str:
    explicit = os.environ.get("TRAINGUARD_ALERTMANAGER")
    for name in ((explicit,) if explicit else CANDIDATES):
        path = shutil.which(name)
        if path:
            return path
    raise AlertmanagerError(
        "Alertmanager not found (looked for " + ", ".join(CANDIDATES) + " on PATH and "
        "$TRAINGUARD_ALERTMANAGER): install Debian's prometheus-alertmanager "
        "(apt-get install prometheus-alertmanager)")


def webhook_config(url: str, *, group_wait: str = "1s", group_interval: str = "1s",
                   repeat_interval: str = "1h", group_by: tuple[str, ...] = (
                       "job_id", "incident_id")) -> str:
    """Every alert to one webhook (with resolved notifications), grouped per incident."""
    doc = {
        "route": {"receiver": "webhook", "group_by": list(group_by), "group_wait": group_wait,
                  "group_interval": group_interval, "repeat_interval": repeat_interval},
        "receivers": [{"name": "webhook", "webhook_configs": [
            {"url": url, "send_resolved": True, "max_alerts": 0}]}],
    }
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass(frozen=True)
class AlertmanagerInfo:
    pid: int
    port: int
    root: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class LocalAlertmanager:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._proc: subprocess.Popen[bytes] | None = None
        self.info: AlertmanagerInfo | None = None

    @property
    def log_file(self) -> Path:
        return self.root / "alertmanager.log"

    def start(self, config_yaml: str, timeout_s: float = 30.0) -> AlertmanagerInfo:
        binary = find_binary()
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "alertmanager.yml"
        config.write_text(config_yaml)
        port = free_port()
        argv = [binary, f"--config.file={config}", f"--storage.path={self.root / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
                "--log.level=info"]
        with open(self.log_file, "ab") as log:
            self._proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        self.info = AlertmanagerInfo(self._proc.pid, port, str(self.root))
        problem = wait_ready(self.info.url, self._proc, timeout_s)
        if problem is None:
            return self.info
        self.stop()
        raise AlertmanagerError(f"alertmanager {problem}:\n{self.tail()}")

    def stop(self, grace_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> LocalAlertmanager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
