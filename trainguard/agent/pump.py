"""A thread that empties the step socket as datagrams arrive.

The kernel queues only a few datagrams per Unix socket (``net.unix.max_dgram_qlen``, 10 by
default) and the trainer-side hook drops rather than blocks when the queue is full. The agent's
event loop is busy for a while at every tick (scraping GPUs, running ``ss``), so it must not be
the one that drains: this thread does, into an in-memory queue the loop empties at leisure.
"""

from __future__ import annotations

import logging
import queue
import select
import threading
from collections.abc import Callable, Sequence

from trainguard.collectors.base import Discrete

log = logging.getLogger(__name__)


class SocketPump:
    def __init__(self, fd: int, drain: Callable[[], Sequence[Discrete]]) -> None:
        self._fd = fd
        self._drain = drain
        self._queue: queue.SimpleQueue[Discrete] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-socket-pump", daemon=True)

    def start(self) -> SocketPump:
        self._thread.start()
        return self

    def take(self, now_us: int = 0) -> list[Discrete]:
        """Everything pumped so far, in arrival order (a fast poll for the agent loop)."""
        out: list[Discrete] = []
        while True:
            try:
                out.append(self._queue.get_nowait())
            except queue.Empty:
                return out

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([self._fd], [], [], 0.2)
            except (OSError, ValueError):  # socket closed under us: the agent is stopping
                return
            if not ready:
                continue
            try:
                for item in self._drain():
                    self._queue.put(item)
            except Exception:
                log.exception("draining the step socket failed")
