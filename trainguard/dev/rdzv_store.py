"""The rendezvous store of the dev Slurm cluster: a torch ``TCPStore`` server on the head.

torchrun's c10d rendezvous keeps its state in the store at ``--rdzv-endpoint``. When that
endpoint is one of the compute nodes, losing that node loses the rendezvous and every survivor's
agent with it; here the store runs on the head (off the compute nodes, as an etcd or a head-node
store is in production), so any one node can go and the others re-rendezvous.

``python -m trainguard.dev.rdzv_store --host H --port P`` serves until killed.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trainguard.dev.rdzv_store",
                                 description="serve a torch TCPStore for c10d rendezvous")
    ap.add_argument("--host", required=True, help="address to listen on (the head's)")
    ap.add_argument("--port", type=int, required=True, help="TCP port")
    args = ap.parse_args(argv)
    try:
        from torch._C._distributed_c10d import TCPStore
    except ImportError:
        print("trainguard.dev.rdzv_store: torch is not installed (pip install "
              "'trainguard[workload]')", file=sys.stderr)
        return 2
    try:
        store = TCPStore(args.host, args.port, is_master=True, wait_for_workers=False,
                         multi_tenant=True)
    except (RuntimeError, OSError) as exc:
        print(f"trainguard.dev.rdzv_store: cannot listen on {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 2
    print(f"rendezvous store on {args.host}:{args.port}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    del store
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
