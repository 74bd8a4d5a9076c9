"""The node agent's CPU cost on one node: 8 GPUs from a recorded dcgm-exporter scrape (served
over real HTTP) + 8 rank processes + NICs + kernel log, sampled at 1 Hz, for a while.

    .venv/bin/python -m bench.bench_agent [seconds]

Prints the agent process's CPU % (user+sys over wall time) and per-interval CPU ms.
"""

from __future__ import annotations

import asyncio
import http.server
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench._common import bench_broker
from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig

RECORDING = Path(__file__).resolve().parents[1] / "tests/fixtures/gpu/aicr_eks_8xH100_metrics.prom"


def serve(path: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    body = path.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/metrics"


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    server, url = serve(RECORDING)
    env = {**os.environ, "TRAINGUARD_JOB_ID": "job-bench"}
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                              env={**env, "TRAINGUARD_RANK": str(r)}) for r in range(8)]
    try:
        with bench_broker() as info, tempfile.TemporaryDirectory() as tmp:
            asyncio.run(ensure_topics(KafkaConfig(bootstrap=info.bootstrap,
                                                  topic_prefix="bench-agent")))
            agent = subprocess.Popen(
                [sys.executable, "-m", "trainguard.cli.main", "agent", "--node", "bench-node",
                 "--bootstrap", info.bootstrap, "--prefix", "bench-agent", "--gpu", "dcgm",
                 "--dcgm-url", url, "--discover", "--metrics-port", "0",
                 "--spool-dir", f"{tmp}/spool", "--socket", f"{tmp}/agent.sock"])
            proc = psutil.Process(agent.pid)
            time.sleep(5)  # start-up (imports, first scrape) is not the steady cost
            t0 = proc.cpu_times()
            w0 = time.monotonic()
            time.sleep(seconds)
            t1 = proc.cpu_times()
            wall = time.monotonic() - w0
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)
        cpu = (t1.user - t0.user) + (t1.system - t0.system)
        print(f"agent: 8 GPUs (dcgm scrape) + 8 ranks at 1 Hz over {wall:.1f} s: "
              f"CPU {100 * cpu / wall:.2f}% of one core, {1000 * cpu / wall:.1f} ms per interval")
    finally:
        for r in ranks:
            r.kill()
            r.wait()
        server.shutdown()


if __name__ == "__main__":
    main()
