"""One connected, non-blocking Unix datagram socket to the agent, with cheap reconnects.

A link never raises: a send that fails is counted in ``dropped`` and the link carries on.
"Queue full" (EAGAIN) and ENOBUFS keep the connection but pause sending for ``PAUSE_S``
(200 µs): the queue will not have drained sooner, and a failed send costs an exception
(several µs), against a clock read while paused. Real steps come milliseconds apart, so the
pause only sheds a flood. Any other error (no agent, the agent restarted so the old peer is
gone: ENOENT, ECONNREFUSED, ENOTCONN...) drops the connection, and the next send reconnects.
A failed reconnect is retried at most every ``retry_s``, so a trainer without an agent pays
one monotonic clock read per report, not a syscall.

One link belongs to one thread: the reporter gives its heartbeat thread a link of its own.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable

from trainguard_sdk.wire import Bytes

_KEEP = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS, errno.EINTR})
PAUSE_S = 200e-6


class Link:
    __slots__ = ("closed", "dropped", "last_errno", "path", "resume_at", "retry_at", "retry_s",
                 "send_fn", "sent", "sock")

    def __init__(self, path: str, retry_s: float) -> None:
        self.path = path
        self.retry_s = retry_s
        self.sock: socket.socket | None = None
        # The connected socket's bound ``send``; None when not connected or paused: the
        # reporter's hot path calls it, and falls back to ``send`` when it is None.
        self.send_fn: Callable[[Bytes], int] | None = None
        self.retry_at = 0.0
        self.resume_at = 0.0
        self.sent = 0
        self.dropped = 0
        self.last_errno: int | None = None
        self.closed = False

    def connect(self) -> socket.socket | None:
        """Connect now unless closed or a recent attempt failed; None when not connected."""
        if self.closed:
            return None
        now = time.monotonic()
        if now < self.retry_at:
            return None
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        except OSError as exc:  # EMFILE and friends: try again later
            self.last_errno = exc.errno
            self.retry_at = now + self.retry_s
            return None
        try:
            sock.setblocking(False)
            sock.connect(self.path)
        except OSError as exc:
            sock.close()
            self.last_errno = exc.errno
            self.retry_at = now + self.retry_s
            return None
        self.sock = sock
        self.send_fn = sock.send
        return sock

    def send(self, data: Bytes) -> bool:
        sock = self.sock
        if sock is None:
            sock = self.connect()
            if sock is None:
                self.dropped += 1
                return False
        elif self.send_fn is None:  # paused after a full queue
            if time.monotonic() < self.resume_at:
                self.dropped += 1
                return False
            self.send_fn = sock.send
        try:
            sock.send(data)
        except OSError as exc:
            self.failed(exc)
            return False
        self.sent += 1
        return True

    def failed(self, exc: OSError) -> None:
        """Count a failed send; drop the connection unless the error is transient."""
        self.dropped += 1
        self.last_errno = exc.errno
        if exc.errno in _KEEP:
            if self.sock is not None:
                self.send_fn = None
                self.resume_at = time.monotonic() + PAUSE_S
            return
        self.disconnect()
        self.retry_at = 0.0  # the agent may be back already (restart): try at the next send

    def disconnect(self) -> None:
        sock, self.sock = self.sock, None
        self.send_fn = None
        if sock is not None:
            sock.close()

    def close(self) -> None:
        self.closed = True
        self.disconnect()
