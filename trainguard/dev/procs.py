"""Processes the dev services start as daemons: is one alive, its pid file, stop it."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def alive(pid: int) -> bool:
    """``pid`` runs and is no zombie (a child of ours that exited is reaped here)."""
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def read_pid(path: Path) -> int | None:
    """The pid a daemon wrote to ``path``; None when there is none (or it is not a number)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def stop_pid(pid: int, grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL once ``grace_s`` has passed with the process still alive."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
