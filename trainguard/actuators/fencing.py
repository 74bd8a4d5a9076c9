"""Fencing: stop a replica for certain, prove a pid before any signal, recognise a stale one.

A process is named by its ``Identity``: pid, start time (``/proc/<pid>/stat`` field 22, clock
ticks since boot) and the boot id (``/proc/sys/kernel/random/boot_id``), as the replica
journal (``journal.py``) recorded them when the actuator started it. ``open_proven`` opens a
pidfd and only then checks that the process behind the pid still has that start time in this
boot (and is no zombie): a pid that was reused, or that the journal never recorded, is never
signalled. Every signal goes through the proven pidfd (``signal.pidfd_send_signal``).

``stop_process`` sends SIGTERM (to the process and its process group), waits ``grace_s``, then
SIGKILL, and returns only once the process is *confirmed* gone: through the pidfd becoming
readable, and for our own children the exit status reaped. A process that cannot be proven is
left alone and reported ``already_gone``.

``is_stale`` is the pure epoch rule: a report carrying a binding epoch lower than the rank's
current epoch comes from a replica that was fenced (or should have been).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

StopHow = Literal["already_gone", "sigterm", "sigkill"]
PROC = Path("/proc")


class FenceError(RuntimeError):
    """The replica could not be confirmed dead: nothing may be bound in its place."""


@dataclass(frozen=True)
class Identity:
    """Which process a pid meant when it was recorded."""

    pid: int
    start_ticks: int
    boot_id: str


@dataclass(frozen=True)
class Stopped:
    pid: int
    how: StopHow
    waited_ms: float

    def describe(self) -> str:
        if self.how == "already_gone":
            return f"process {self.pid} (already gone)"
        return f"process {self.pid} ({self.how}, confirmed dead after {self.waited_ms:.0f} ms)"


def is_stale(report_epoch: int, current_epoch: int) -> bool:
    return report_epoch < current_epoch


def boot_id(proc: Path = PROC) -> str:
    return (proc / "sys/kernel/random/boot_id").read_text().strip()


def stat_fields(pid: int, proc: Path = PROC) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 (state) on, or None when the pid is gone. The command
    name (field 2) may hold spaces and parentheses: split after its last ``)``."""
    try:
        data = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    tail = data.rsplit(b")", 1)
    if len(tail) != 2:
        return None
    return tail[1].decode("ascii", "replace").split()


def start_ticks(pid: int, proc: Path = PROC) -> int | None:
    """The process's start time (field 22) when it is alive and no zombie, else None."""
    fields = stat_fields(pid, proc)
    if fields is None or len(fields) < 20 or fields[0] in ("Z", "X", "x"):
        return None
    try:
        return int(fields[19])
    except ValueError:
        return None


def identify(pid: int) -> Identity | None:
    """The identity of ``pid`` now (to record a process just started), or None when gone."""
    ticks = start_ticks(pid)
    return None if ticks is None else Identity(pid, ticks, boot_id())


def open_proven(ident: Identity) -> int | None:
    """A pidfd of ``ident``'s process if it is still that process (same start time, same boot,
    not a zombie), else None. The pidfd is opened *before* the check: whatever the pid means
    later, the descriptor keeps naming the process that was proven."""
    try:
        pidfd = os.pidfd_open(ident.pid)
    except (ProcessLookupError, OSError):
        return None
    try:
        if boot_id() == ident.boot_id and start_ticks(ident.pid) == ident.start_ticks:
            return pidfd
    except OSError:
        pass
    os.close(pidfd)
    return None


def send(ident: Identity, sig: signal.Signals) -> bool:
    """Signal the process only (not its group) if it is proven; True if it was sent."""
    pidfd = open_proven(ident)
    if pidfd is None:
        return False
    try:
        signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(pidfd)


def stop_process(ident: Identity, grace_s: float, *,
                 popen: subprocess.Popen[bytes] | None = None,
                 kill_timeout_s: float = 10.0) -> Stopped:
    t0 = time.monotonic()
    pid = ident.pid
    pidfd = open_proven(ident)
    if pidfd is None:
        _reap(popen)
        return Stopped(pid, "already_gone", 0.0)
    try:
        _signal(pidfd, pid, signal.SIGTERM)
        how: StopHow = "sigterm"
        if not _wait_pidfd(pidfd, grace_s):
            how = "sigkill"
            _signal(pidfd, pid, signal.SIGKILL)
            if not _wait_pidfd(pidfd, kill_timeout_s):
                raise FenceError(f"process {pid} still alive {kill_timeout_s:.0f} s after "
                                 "SIGKILL (uninterruptible sleep?): not confirmed dead")
        _reap(popen)
        return Stopped(pid, how, (time.monotonic() - t0) * 1000)
    finally:
        os.close(pidfd)


def kill_now(ident: Identity) -> bool:
    """SIGKILL a proven stale replica at once; True if it was alive (now confirmed dead)."""
    return stop_process(ident, 0.0).how != "already_gone"


def _signal(pidfd: int, pid: int, sig: signal.Signals) -> None:
    """``sig`` to the proven process, and to its process group when it leads one (the rank's
    own children, data loader workers, share it): the group first, while the pidfd shows the
    leader still alive (so the group id is still its own)."""
    try:
        if not _wait_pidfd(pidfd, 0) and os.getpgid(pid) == pid:
            os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        pass


def _wait_pidfd(pidfd: int, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(max(0, int(timeout_s * 1000))))


def _reap(popen: subprocess.Popen[bytes] | None) -> None:
    if popen is not None:
        try:
            popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
