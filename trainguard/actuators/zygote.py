"""A warm launcher: a process that has already imported the workload's heavy modules (torch)
and forks a new rank on request, so a restart does not pay the import again on every rank.

    python -m trainguard.actuators.zygote --socket PATH --preload torch --preload MODULE

Protocol (one request per connection, JSON lines over a Unix stream socket):
``{"module": M, "args": [...], "env": {...}, "cpus": [...], "log": PATH}`` ->
``{"pid": P}`` or ``{"error": "..."}``. The child starts a new session, pins itself to the
CPUs, sends its output to the log, replaces its environment with ``env`` and runs ``M`` as
``__main__`` (like ``python -m M args``). The zygote reaps its children; their exits are seen
by pidfd like any other rank (the fencing path does not need to be their parent), and each
stays a zombie for a few seconds so that the node agent can read how it ended.

Note: ``/proc/<pid>/environ`` of a forked rank shows the zygote's environment, not ``env``:
identity checks use the pool's record of launched pids (``pool.PoolState.launched``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

REAP_AFTER_S = 10.0


def _reap_old(children: dict[int, float], now: float) -> None:
    """Reap children that have been dead for ``REAP_AFTER_S``: until then the zombie keeps its
    exit status readable in /proc/<pid>/stat for the node agent, which is not its parent (the
    status is gone once reaped). A pidfd reports the exit at once either way."""
    for pid in list(children):
        try:
            with open(f"/proc/{pid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            state = b"Z"
        if state != b"Z":
            continue
        if children[pid] == 0.0:
            children[pid] = now
        elif now - children[pid] >= REAP_AFTER_S:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            del children[pid]


def _child(req: dict[str, Any], conn: socket.socket, server: socket.socket) -> None:
    code = 1
    try:
        conn.close()
        server.close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.setsid()
        cpus = set(req.get("cpus") or []) & os.sched_getaffinity(0)
        if cpus:
            os.sched_setaffinity(0, cpus)
        log = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = [req["module"], *req["args"]]
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(path: Path, preload: list[str]) -> None:
    for name in preload:
        importlib.import_module(name)
    path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(16)
    server.settimeout(1.0)
    children: dict[int, float] = {}  # pid -> when first seen dead (0: alive)
    pid_file(path).write_text(f"{os.getpid()}\n")
    print(f"zygote {os.getpid()}: ready on {path} with {preload}", flush=True)
    while True:
        _reap_old(children, time.monotonic())
        try:
            conn, _ = server.accept()
        except (InterruptedError, TimeoutError):
            continue
        conn.settimeout(None)
        with conn:
            try:
                line = conn.makefile("rb").readline()
                if not line.strip():
                    continue  # a liveness probe
                req = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    _child(req, conn, server)
                children[pid] = 0.0
                reply: dict[str, Any] = {"pid": pid}
            except Exception as exc:
                reply = {"error": repr(exc)}
            try:
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass  # the requester left; a forked child runs on and is fenced as usual


def pid_file(path: Path) -> Path:
    """Where the zygote serving ``path`` writes its pid (to stop it: SIGTERM that pid)."""
    return path.with_suffix(".pid")


def stop(path: Path) -> None:
    """Stop the zygote serving ``path`` (its forked ranks are not touched)."""
    try:
        os.kill(int(pid_file(path).read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        pass


def spawn(path: Path, module: str, args: list[str], env: dict[str, str], cpus: list[int],
          log: Path, timeout_s: float = 30.0) -> int:
    """Ask the zygote at ``path`` for a new process; its pid."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(path))
        sock.sendall(json.dumps({"module": module, "args": args, "env": env, "cpus": cpus,
                                 "log": str(log)}).encode() + b"\n")
        reply = json.loads(sock.makefile("rb").readline())
    if "pid" not in reply:
        raise OSError(f"zygote {path}: {reply.get('error', reply)}")
    return int(reply["pid"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", type=Path, required=True)
    ap.add_argument("--preload", action="append", default=[])
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serve(args.socket, args.preload)


if __name__ == "__main__":
    main()
