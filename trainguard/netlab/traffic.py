"""TCP traffic for the lab, run as a process inside a namespace.

``sink --bind ADDR --port P``: accept connections, discard what they send; prints ``ready``.
``send --to ADDR:P --seconds S [--rate-bytes R]``: stream for S seconds, paced to R bytes/s when
given (unpaced saturates a loaded 2-core host, whose starved stack then resends spuriously);
prints ``{"bytes":..,"seconds":..}``.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from collections.abc import Sequence


def sink(bind: str, port: int, max_s: float) -> None:
    srv = socket.create_server((bind, port), reuse_port=False)
    srv.settimeout(0.5)
    print("ready", flush=True)
    end = time.monotonic() + max_s

    def drain(c: socket.socket) -> None:
        c.settimeout(max_s)
        with c:
            try:
                while c.recv(1 << 16):
                    pass
            except OSError:
                return

    while time.monotonic() < end:
        try:
            conn, _ = srv.accept()
        except TimeoutError:
            continue
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


def send(to: str, seconds: float, rate_bytes: float | None = None) -> None:
    host, _, port = to.rpartition(":")
    s = socket.create_connection((host, int(port)), timeout=5)
    s.settimeout(max(5.0, seconds))
    buf = b"\0" * (1 << 16)
    sent = 0
    t0 = time.monotonic()
    print("connected", flush=True)
    while (elapsed := time.monotonic() - t0) < seconds:
        if rate_bytes is not None and sent > rate_bytes * elapsed:
            time.sleep(min(0.005, (sent - rate_bytes * elapsed) / rate_bytes))
            continue
        try:
            sent += s.send(buf)
        except TimeoutError:
            break
    took = time.monotonic() - t0
    s.close()
    print(json.dumps({"bytes": sent, "seconds": took}), flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainguard.netlab.traffic")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sink")
    s.add_argument("--bind", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--max-seconds", type=float, default=60.0)
    t = sub.add_parser("send")
    t.add_argument("--to", required=True)
    t.add_argument("--seconds", type=float, default=3.0)
    t.add_argument("--rate-bytes", type=float, default=None, help="pace to this many bytes/s")
    a = ap.parse_args(argv)
    if a.cmd == "sink":
        sink(a.bind, a.port, a.max_seconds)
    else:
        send(a.to, a.seconds, a.rate_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
