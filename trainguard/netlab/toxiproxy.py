"""Toxiproxy (github.com/Shopify/toxiproxy): built once with ``go install`` into a cache outside
the repo, run on 127.0.0.1, driven through its HTTP API. It adds latency/jitter (and other
toxics) at the TCP-stream level, where this kernel has no netem qdisc.

Note the binary's package path: since v2.2 it is ``cmd/server`` (``cmd/toxiproxy-server`` is
gone); the built ``server`` is renamed ``toxiproxy-server`` in the cache.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from trainguard.netlab.ns import LabError
from trainguard.netlab.procs import LineProcess

VERSION = "v2.12.0"
MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
HOST = "127.0.0.1"


def cache_dir() -> Path:
    base = os.environ.get("TRAINGUARD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trainguard")
    return Path(base)


def ensure_toxiproxy_server(version: str = VERSION, *, timeout_s: float = 600.0) -> Path:
    """The toxiproxy-server binary of ``version``: ``$TOXIPROXY_SERVER`` if set, else the
    cached build, else built now with ``go install`` (bounded by ``timeout_s``)."""
    env_bin = os.environ.get("TOXIPROXY_SERVER")
    if env_bin:
        return Path(env_bin)
    dest_dir = cache_dir() / f"toxiproxy-{version}"
    dest = dest_dir / "toxiproxy-server"
    if dest.is_file() and os.access(dest, os.X_OK):
        return dest
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go")
                                else None)
    if go is None:
        raise LabError("toxiproxy-server is not built and Go is not installed")
    dest_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOBIN=str(dest_dir), CGO_ENABLED="0")
    try:
        subprocess.run([go, "install", f"{MODULE}@{version}"], env=env, cwd=dest_dir,
                       capture_output=True, text=True, timeout=timeout_s, check=True)
    except subprocess.CalledProcessError as exc:
        raise LabError(f"go install {MODULE}@{version}: {exc.stderr.strip()}") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"go install {MODULE}@{version}: {exc}") from exc
    (dest_dir / "server").replace(dest)
    return dest


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class ToxiproxyServer:
    """``toxiproxy-server`` on 127.0.0.1 at a free port; a context manager."""

    def __init__(self, binary: Path | None = None, *, port: int | None = None) -> None:
        self.binary = binary or ensure_toxiproxy_server()
        self.port = port or free_port()
        self.url = f"http://{HOST}:{self.port}"
        self._proc: LineProcess | None = None

    def __enter__(self) -> ToxiproxyServer:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self, timeout_s: float = 10.0) -> None:
        self._proc = LineProcess([str(self.binary), "-host", HOST, "-port", str(self.port)],
                                 quiet=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.proc.poll() is not None:
                raise LabError(f"toxiproxy-server exited: {self._proc.stderr_tail()}")
            with contextlib.suppress(OSError, LabError):
                self.api("GET", "/version", timeout_s=1.0)
                return
            time.sleep(0.05)
        self.close()
        raise LabError(f"toxiproxy-server not answering on {self.url} in {timeout_s}s")

    def api(self, method: str, path: str, body: dict[str, Any] | None = None,
            timeout_s: float = 5.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise LabError(f"toxiproxy {method} {path}: {exc.code} {exc.read()[:300]!r}") from exc
        return json.loads(raw) if raw.strip() else None

    def create_proxy(self, name: str, upstream: str, listen_port: int | None = None) -> int:
        """A proxy on 127.0.0.1 (free port unless given) to ``upstream``; its listen port."""
        port = listen_port or free_port()
        self.api("POST", "/proxies",
                 {"name": name, "listen": f"{HOST}:{port}", "upstream": upstream,
                  "enabled": True})
        return port

    def add_latency(self, proxy: str, latency_ms: int, jitter_ms: int = 0,
                    stream: str = "downstream", name: str | None = None) -> str:
        toxic = name or f"latency_{stream}"
        self.api("POST", f"/proxies/{proxy}/toxics",
                 {"name": toxic, "type": "latency", "stream": stream, "toxicity": 1.0,
                  "attributes": {"latency": latency_ms, "jitter": jitter_ms}})
        return toxic

    def remove_toxic(self, proxy: str, toxic: str) -> None:
        self.api("DELETE", f"/proxies/{proxy}/toxics/{toxic}")

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc = None
