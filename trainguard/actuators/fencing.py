"""Fencing: stop a replica for certain, and recognise a stale one.

``stop_process`` sends SIGTERM (to the process and its process group), waits ``grace_s``, then
SIGKILL, and returns only once the process is *confirmed* gone: through a pidfd (which cannot
be fooled by pid reuse) becoming readable, and for our own children the exit status reaped.
A process whose start time differs from the recorded one is a different process that reused
the pid: it is left alone and reported ``already_gone``.

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
from typing import Literal

import psutil

StopHow = Literal["already_gone", "sigterm", "sigkill"]


class FenceError(RuntimeError):
    """The replica could not be confirmed dead: nothing may be bound in its place."""


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


def same_process(pid: int, create_time: float | None) -> bool:
    """Is ``pid`` still the process that was started at ``create_time`` (and not a zombie)?"""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 0.05
    except psutil.Error:
        return False


def stop_process(pid: int, create_time: float | None, grace_s: float, *,
                 popen: subprocess.Popen[bytes] | None = None,
                 kill_timeout_s: float = 10.0) -> Stopped:
    t0 = time.monotonic()
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        _reap(popen)
        return Stopped(pid, "already_gone", 0.0)
    try:
        if not same_process(pid, create_time):
            _reap(popen)
            return Stopped(pid, "already_gone", 0.0)
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


def is_replica_of(pid: int, job: str, rank: int) -> bool:
    """Does ``pid`` carry the job's and the rank's identity in its environment? (Never kill a
    process that merely reused a reported pid.)"""
    try:
        env = psutil.Process(pid).environ()
    except psutil.Error:
        return False
    return env.get("TRAINGUARD_JOB_ID") == job and env.get("TRAINGUARD_RANK") == str(rank)


def kill_now(pid: int, create_time: float | None) -> bool:
    """SIGKILL a stale replica at once; True if it was alive (and is now confirmed dead)."""
    if not same_process(pid, create_time):
        return False
    return stop_process(pid, create_time, 0.0).how != "already_gone"


def _signal(pidfd: int, pid: int, sig: signal.Signals) -> None:
    try:
        signal.pidfd_send_signal(pidfd, sig)
    except ProcessLookupError:
        return
    try:  # the rank's own children (data loader workers) share its process group
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
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
