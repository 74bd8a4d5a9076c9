"""A plain ``http.server`` on loopback served from a background daemon thread, so that it answers
whatever event loop (or none) the client under test runs in. The local receivers build on it."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class BackgroundHTTPServer:
    def __init__(self, handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1",
                 port: int = 0, name: str = "http-server") -> None:
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._name = name
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name=self._name,
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:  # shutdown() waits for a serve_forever that never ran
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()
