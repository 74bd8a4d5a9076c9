"""Run the net collector as a process, e.g. inside a namespace (``ip netns exec NS python -m
trainguard.collectors.net``), printing one JSON reading per line.

``--stdin``: one collect per line read from stdin (the caller decides when), until EOF.
Otherwise ``--count`` collects, ``--interval`` seconds apart. ``--peer HOST[:PORT][/PROBE]``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from trainguard.collectors.base import Reading
from trainguard.collectors.net.collector import NetCollector
from trainguard.collectors.net.peers import PeerSpec
from trainguard.events.clock import now_us


def parse_peer(text: str) -> PeerSpec:
    addr, _, probe = text.partition("/")
    port: int | None = None
    if addr.startswith("["):
        host, _, rest = addr[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif addr.count(":") == 1:
        host, p = addr.split(":")
        port = int(p)
    else:
        host = addr
    return PeerSpec(host=host, port=port, probe_port=int(probe) if probe else None)


def reading_to_json(reading: Reading) -> dict[str, Any]:
    return {
        "nics": [n.model_dump(mode="json") for n in reading.nics],
        "paths": [p.model_dump(mode="json") for p in reading.paths],
        "tcp_retransmits": reading.tcp_retransmits,
        "discrete": [d.payload.model_dump(mode="json") | {"_type": type(d.payload).__name__}
                     for d in reading.discrete],
        "malformed": reading.malformed,
    }


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainguard.collectors.net")
    ap.add_argument("--node", default="local")
    ap.add_argument("--sys-root", default="/sys")
    ap.add_argument("--proc-root", default="/proc")
    ap.add_argument("--iface", action="append", default=None)
    ap.add_argument("--peer", action="append", default=[])
    ap.add_argument("--stdin", action="store_true")
    ap.add_argument("--count", type=int, default=1)
    ap.add_argument("--interval", type=float, default=1.0)
    a = ap.parse_args(argv)
    coll = NetCollector(a.node, sys_root=a.sys_root, proc_root=a.proc_root,
                        interfaces=a.iface, peers=[parse_peer(p) for p in a.peer])

    def emit() -> None:
        sys.stdout.write(json.dumps(reading_to_json(coll.collect(now_us()))) + "\n")
        sys.stdout.flush()

    try:
        if a.stdin:
            for _ in sys.stdin:
                emit()
        else:
            for i in range(a.count):
                if i:
                    time.sleep(a.interval)
                emit()
    finally:
        coll.close()
    return 0
