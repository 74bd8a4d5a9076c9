"""Faults through signals on real processes: a worker exit (SIGKILL/SIGTERM), a hang (SIGSTOP,
undone with SIGCONT), a node loss (every rank on a node's units killed in one pass) and a
slowdown by SIGSTOP/SIGCONT duty cycle."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence

from trainguard.drills.injectors.base import Acted, InjectionError
from trainguard.events.clock import now_us


def signal_number(name: str) -> signal.Signals:
    try:
        return signal.Signals[name]
    except KeyError:
        raise InjectionError(f"signal: unknown signal name {name!r}") from None


def _send(pid: int, sig: signal.Signals) -> bool:
    """True if delivered; False if the process is gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    except PermissionError as exc:
        raise InjectionError(f"cannot signal pid {pid}: {exc}") from None
    return True


class WorkerExit:
    def __init__(self, pid: int, signal_name: str = "SIGKILL") -> None:
        self.pid = pid
        self.sig = signal_number(signal_name)

    def inject(self) -> Acted:
        if not _send(self.pid, self.sig):
            raise InjectionError(f"pid {self.pid} is already gone")
        return Acted.now(pid=self.pid, signal=self.sig.name)

    def undo(self) -> Acted:
        return Acted.now(pid=self.pid, undo="none: an ended process is not brought back; "
                         "recovering it is the loop's job")


class Hang:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.stopped = False

    def inject(self) -> Acted:
        if not _send(self.pid, signal.SIGSTOP):
            raise InjectionError(f"pid {self.pid} is already gone")
        self.stopped = True
        return Acted.now(pid=self.pid, signal="SIGSTOP")

    def undo(self) -> Acted:
        if not self.stopped:
            return Acted.now(pid=self.pid, undo="nothing to undo")
        alive = _send(self.pid, signal.SIGCONT)
        self.stopped = False
        return Acted.now(pid=self.pid, signal="SIGCONT", alive=alive)


class NodeLoss:
    """Every given pid signalled in one tight pass (microseconds apart)."""

    def __init__(self, pids: Sequence[int], signal_name: str = "SIGKILL",
                 node: str = "") -> None:
        if not pids:
            raise InjectionError(f"node {node!r}: no rank runs on it")
        self.pids = list(pids)
        self.sig = signal_number(signal_name)
        self.node = node

    def inject(self) -> Acted:
        t = now_us()
        hit = [pid for pid in self.pids if _send(pid, self.sig)]
        if not hit:
            raise InjectionError(f"node {self.node!r}: every pid was already gone")
        return Acted(t, {"node": self.node, "pids": list(hit), "signal": self.sig.name,
                         "spread_us": now_us() - t})

    def undo(self) -> Acted:
        return Acted.now(node=self.node, undo="none: a lost node's ranks are not brought back")


class StopDuty:
    """A slowdown without cgroups: SIGSTOP for ``stop_ms`` then SIGCONT for ``run_ms``, in a
    loop, until undone (which always leaves the process running)."""

    def __init__(self, pid: int, stop_ms: int, run_ms: int) -> None:
        if stop_ms <= 0 or run_ms <= 0:
            raise InjectionError("stop_ms and run_ms must be > 0")
        self.pid, self.stop_ms, self.run_ms = pid, stop_ms, run_ms
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self.cycles = 0

    def _loop(self) -> None:
        while not self._halt.is_set():
            if not _send(self.pid, signal.SIGSTOP):
                return
            self._halt.wait(self.stop_ms / 1000)
            _send(self.pid, signal.SIGCONT)
            self.cycles += 1
            self._halt.wait(self.run_ms / 1000)

    def inject(self) -> Acted:
        if not _send(self.pid, signal.SIGCONT):
            raise InjectionError(f"pid {self.pid} is already gone")
        self._thread = threading.Thread(target=self._loop, daemon=True, name="stop-duty")
        self._thread.start()
        pct = 100 * self.run_ms / (self.run_ms + self.stop_ms)
        return Acted.now(pid=self.pid, stop_ms=self.stop_ms, run_ms=self.run_ms,
                         cpu_time_pct=round(pct, 1))

    def undo(self) -> Acted:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        alive = _send(self.pid, signal.SIGCONT)
        time.sleep(0)
        return Acted.now(pid=self.pid, signal="SIGCONT", cycles=self.cycles, alive=alive)
