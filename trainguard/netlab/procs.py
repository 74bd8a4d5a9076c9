"""A child process read line by line with bounded waits."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path


class LineProcess:
    """``argv`` in its own process group; stdout read as lines, every read bounded."""

    def __init__(self, argv: Sequence[str], *, env: dict[str, str] | None = None,
                 cwd: Path | None = None, stdin: bool = False, quiet: bool = False) -> None:
        """``quiet``: stdout is discarded (a chatty server whose pipe nobody reads)."""
        self.argv = list(argv)
        # stderr to a file, never a pipe: a full pipe nobody reads would block the child.
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in kill)
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.DEVNULL if quiet else subprocess.PIPE, stderr=self._err,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            env=env, cwd=cwd, start_new_session=True, text=True, bufsize=1)
        self._sel = selectors.DefaultSelector()
        if self.proc.stdout is not None:
            self._sel.register(self.proc.stdout, selectors.EVENT_READ)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def readline(self, timeout_s: float) -> str:
        """The next stdout line; ``TimeoutError`` after ``timeout_s``, ``EOFError`` at exit."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no line from {self.argv[-3:]} in {timeout_s}s")
            if self._sel.select(left):
                line = self.proc.stdout.readline()
                if not line:
                    raise EOFError(f"{self.argv[-3:]} exited: {self.stderr_tail()}")
                return line.rstrip("\n")

    def wait(self, timeout_s: float) -> int:
        return self.proc.wait(timeout=timeout_s)

    def stderr_tail(self) -> str:
        with contextlib.suppress(OSError, ValueError):
            self._err.seek(0)
            return self._err.read()[-2000:].decode("utf-8", "replace")
        return ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self._sel.close()
        self._err.close()
