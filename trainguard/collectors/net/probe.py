"""An application-level RTT probe between agents: a tiny TCP echo responder and its client.

The kernel's RTT only sees delay below TCP (wire, queues). A delay added above it (a proxy
such as Toxiproxy, a peer process that stalls) shows only in a round trip through user space:
the client sends an 8-byte sequence number, the responder echoes it, the client times it.

Wire format: 8 bytes, big-endian sequence number, echoed unchanged. Nothing else.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import struct
import threading
import time
from dataclasses import dataclass

FRAME = struct.Struct(">Q")


class EchoResponder:
    """Echoes frames back on ``host:port`` (``port=0``: a free one, see ``port``), one thread per
    connection. ``close`` stops it and its connections."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(16)
        self._sock.settimeout(0.2)
        self.port: int = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="echo-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError):
            while not self._stop.is_set():
                data = conn.recv(4096)
                if not data:
                    break
                conn.sendall(data)
        conn.close()

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)
                c.close()
        self._thread.join(timeout=2)


@dataclass(frozen=True)
class ProbeResult:
    samples_ms: tuple[float, ...]
    failed: int

    @property
    def rtt_ms(self) -> float | None:
        return statistics.fmean(self.samples_ms) if self.samples_ms else None

    @property
    def rtt_var_ms(self) -> float | None:
        """Mean deviation of the samples, as the kernel's rttvar is a mean deviation."""
        if not self.samples_ms:
            return None
        m = statistics.fmean(self.samples_ms)
        return statistics.fmean(abs(s - m) for s in self.samples_ms)


class EchoProbe:
    """Client of one responder; keeps its connection between probes, reconnects after errors."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._sock: socket.socket | None = None
        self._seq = 0

    def probe(self, samples: int, budget_s: float) -> ProbeResult:
        """Up to ``samples`` round trips, all within ``budget_s`` seconds in total."""
        deadline = time.monotonic() + budget_s
        got: list[float] = []
        failed = 0
        for _ in range(samples):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                got.append(self._once(left))
            except (OSError, ValueError):
                failed += 1
                self.close()
        return ProbeResult(tuple(got), failed)

    def _once(self, timeout_s: float) -> float:
        if self._sock is None:
            s = socket.create_connection((self.host, self.port), timeout=timeout_s)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sock = s
        sock = self._sock
        sock.settimeout(timeout_s)
        self._seq += 1
        frame = FRAME.pack(self._seq)
        t0 = time.perf_counter()
        sock.sendall(frame)
        buf = b""
        while len(buf) < FRAME.size:
            chunk = sock.recv(FRAME.size - len(buf))
            if not chunk:
                raise ConnectionResetError("responder closed")
            buf += chunk
        ms = (time.perf_counter() - t0) * 1000.0
        if buf != frame:
            raise ValueError("echo mismatch")
        return ms

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None
