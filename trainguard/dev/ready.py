"""Waiting for a locally started server of the Prometheus family (Prometheus, Alertmanager) to
answer ``GET /-/ready`` with 200, bounded, giving up early when its process has exited."""

from __future__ import annotations

import subprocess
import time
import urllib.error
import urllib.request


def answers_ready(base_url: str, timeout_s: float = 1.0) -> bool:
    try:
        with urllib.request.urlopen(base_url + "/-/ready", timeout=timeout_s) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_ready(base_url: str, proc: subprocess.Popen[bytes], timeout_s: float,
               poll_s: float = 0.1) -> str | None:
    """None once ready; otherwise why not (the process exited, or the time ran out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"exited with {proc.returncode}"
        if answers_ready(base_url):
            return None
        time.sleep(poll_s)
    return f"not ready after {timeout_s:.0f}s"
