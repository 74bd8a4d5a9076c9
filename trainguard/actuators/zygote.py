"""A warm launcher: a process that has already imported the workload's heavy modules (torch)
and forks a new rank on request, so a restart does not pay the import again on every rank.

    python -m trainguard.actuators.zygote --socket PATH --preload torch --preload MODULE

Protocol (one request per connection, JSON lines over a Unix stream socket):
``{"module": M, "args": [...], "env": {...}, "cpus": [...], "log": PATH, "journal": PATH,
"record": {"job", "rank", "epoch", "unit", "command_id"}}`` -> ``{"pid": P}`` or
``{"error": "..."}``. Every fork is recorded: the child waits at a gate (a pipe) until the
zygote has appended its replica record (pid, start time, boot id and ``record``) to the
replica journal at ``journal`` and fsynced it; a zygote that dies first leaves the child
nothing to read and it exits, so no fork can ever run untracked. Then the child starts a new
session, pins itself to the CPUs, sends its output to the log, replaces its environment with
``env`` and runs ``M`` as ``__main__`` (like ``python -m M args``). The zygote reaps its
children; their exits are seen by pidfd like any other rank (the fencing path does not need to
be their parent), and each stays a zombie for a few seconds so that the node agent can read
how it ended.

Who may ask: the socket is mode 0600 and each connection's peer (``SO_PEERCRED``) must be
root or the zygote's own uid (the actuator's: it started the zygote); others are closed
unanswered. Clients are served by one ``selectors`` loop, never a blocking read: a client
that holds its connection open without sending a whole request is dropped after
``CLIENT_TIMEOUT_S`` and blocks nobody meanwhile.

Note: ``/proc/<pid>/environ`` of a forked rank shows the zygote's environment, not ``env``:
identity checks use the replica journal, never the environment.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from trainguard.actuators.fencing import identify
from trainguard.actuators.journal import Journal
from trainguard.dev.paths import unix_socket_path

REAP_AFTER_S = 10.0
CLIENT_TIMEOUT_S = 5.0
MAX_REQUEST = 1 << 20


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


def _child(req: dict[str, Any], gate: int, inherited: list[socket.socket]) -> None:
    code = 1
    try:
        for sock in inherited:
            sock.close()
        go = os.read(gate, 1) == b"g"  # the journal holds this fork's record
        os.close(gate)
        if not go:
            os._exit(70)
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


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def allowed(uid: int) -> bool:
    return uid in (0, os.getuid())


def _fork(req: dict[str, Any], inherited: list[socket.socket]) -> int:
    """Fork the requested rank; its record is in the journal before it runs a line of it."""
    record = req.get("record")
    journal = req.get("journal")
    if not isinstance(record, dict) or not isinstance(journal, str):
        raise ValueError("a fork needs its journal and record: every fork is recorded")
    gate_r, gate_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(gate_r)
        os.close(gate_w)
        raise
    if pid == 0:
        os.close(gate_w)
        _child(req, gate_r, inherited)
    os.close(gate_r)
    try:
        ident = identify(pid)
        if ident is None:
            raise OSError(f"forked process {pid} is gone before it was recorded")
        Journal(Path(journal)).append({**record, "kind": "replica", "pid": pid,
                                       "start_ticks": ident.start_ticks,
                                       "boot_id": ident.boot_id})
        os.write(gate_w, b"g")
    finally:
        os.close(gate_w)  # without "g" first: the child exits at its gate
    return pid


class _Clients:
    """Connections being read, each with its buffer and deadline."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.open: dict[socket.socket, tuple[bytearray, float]] = {}

    def add(self, conn: socket.socket, now: float) -> None:
        conn.setblocking(False)
        self.open[conn] = (bytearray(), now + CLIENT_TIMEOUT_S)
        self.sel.register(conn, selectors.EVENT_READ)

    def drop(self, conn: socket.socket) -> None:
        self.open.pop(conn, None)
        try:
            self.sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def expire(self, now: float) -> None:
        for conn, (_, deadline) in list(self.open.items()):
            if now >= deadline:
                self.drop(conn)


def _reply(conn: socket.socket, reply: dict[str, Any]) -> None:
    try:
        conn.settimeout(CLIENT_TIMEOUT_S)
        conn.sendall(json.dumps(reply).encode() + b"\n")
    except OSError:
        pass  # the requester left; a forked child runs on, recorded, and is fenced as usual


def socket_path(path: Path) -> Path:
    """Where the zygote named ``path`` binds and is reached. It keeps its name in the run
    directory (its pid file beside it), however deep; the socket itself moves to a short
    directory when ``path`` is too long for a unix socket address."""
    return unix_socket_path(path)


def serve(path: Path, preload: list[str]) -> None:
    for name in preload:
        importlib.import_module(name)
    bound = socket_path(path)
    bound.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    bound.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_mask = os.umask(0o177)
    try:
        server.bind(str(bound))  # mode 0600: only the owner (and root) may connect
    finally:
        os.umask(old_mask)
    server.listen(64)
    server.setblocking(False)
    clients = _Clients()
    clients.sel.register(server, selectors.EVENT_READ)
    children: dict[int, float] = {}  # pid -> when first seen dead (0: alive)
    pid_file(path).write_text(f"{os.getpid()}\n")
    print(f"zygote {os.getpid()}: ready on {path} with {preload}", flush=True)
    while True:
        now = time.monotonic()
        _reap_old(children, now)
        clients.expire(now)
        for key, _ in clients.sel.select(timeout=0.5):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is server:
                _accept(server, clients, now)
                continue
            request = _read(sock, clients)
            if request is None:
                continue
            clients.open.pop(sock, None)
            clients.sel.unregister(sock)
            try:
                req = json.loads(request)
                if not isinstance(req, dict):
                    raise ValueError("a request is one JSON object")
                pid = _fork(req, [server, sock, *clients.open])
                children[pid] = 0.0
                reply: dict[str, Any] = {"pid": pid}
            except Exception as exc:
                reply = {"error": repr(exc)}
            _reply(sock, reply)
            sock.close()


def _accept(server: socket.socket, clients: _Clients, now: float) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except (BlockingIOError, InterruptedError):
            return
        try:
            uid = peer_uid(conn)
        except OSError:
            conn.close()
            continue
        if not allowed(uid):
            print(f"zygote: refused a connection from uid {uid}", flush=True)
            conn.close()
            continue
        clients.add(conn, now)


def _read(conn: socket.socket, clients: _Clients) -> bytes | None:
    """A whole request line once it has arrived; None while incomplete (or dropped)."""
    try:
        data = conn.recv(65536)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        clients.drop(conn)
        return None
    if not data:  # closed: a liveness probe, or a client that gave up
        clients.drop(conn)
        return None
    buf, _ = clients.open[conn]
    buf += data
    if b"\n" in buf:
        return bytes(buf.split(b"\n", 1)[0])
    if len(buf) > MAX_REQUEST:
        clients.drop(conn)
    return None


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
          log: Path, *, journal: Path, record: dict[str, Any], timeout_s: float = 30.0) -> int:
    """Ask the zygote at ``path`` for a new process, recorded in ``journal`` as ``record``
    (job, rank, epoch, unit, command id) before it runs; its pid."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(socket_path(path)))
        sock.sendall(json.dumps({"module": module, "args": args, "env": env, "cpus": cpus,
                                 "log": str(log), "journal": str(journal),
                                 "record": record}).encode() + b"\n")
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
