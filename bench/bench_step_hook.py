"""Cost of ``StepReporter.step()`` per call, against a bare ``sock.send`` of the same bytes.

    .venv/bin/python bench/bench_step_hook.py

Figures are per call, from ``perf_counter_ns`` around batches: median and p99 over batches.

- (a) a receiver listening, drained between batches of 8 (Linux queues at most
  ``net.unix.max_dgram_qlen`` datagrams, 10 by default, so every timed send is accepted);
- (a') a real ``StepReceiver`` draining in another process, one step() every 400 µs (above
  real rates: a node's 8 ranks at 10 steps/s send 80/s), each call timed alone, against a bare
  send paced the same: here the send also wakes the sleeping receiver, which in a VM can cost
  far more than the hook; (a'') the same receiver flooded (batches of 256 back to back): most
  reports are dropped (queue full) and the reporter sheds them cheaply;
- (b) no agent at all (the socket path does not exist);
- bare: ``sock.send`` of the reporter's own datagram bytes, batched and drained as in (a);
- for the choice of format: the struct pack alone, and an orjson dict encoding + send.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import orjson
from trainguard_sdk import Section, StepReporter, wire

SMALL_BATCH = 8
SMALL_BATCHES = 10_000
BIG_BATCH = 256
PACED_N = 5_000
PACED_EVERY_NS = 400_000
BIG_BATCHES = 600


def _drain(sock: socket.socket) -> None:
    while True:
        try:
            sock.recv(wire.MAX_DATAGRAM)
        except BlockingIOError:
            return


Case = tuple[Callable[[int], object], int, Callable[[], None] | None]  # call, batch, between


def timed_all(cases: dict[str, Case], batches: int, rounds: int = 10
              ) -> dict[str, tuple[float, float]]:
    """(median, p99) of per-call µs over batches, per case. The cases run round-robin in
    ``rounds`` slices, so a load change on a shared machine hits them all alike."""
    clock = time.perf_counter_ns
    per_call: dict[str, list[float]] = {name: [] for name in cases}
    i = 0
    for _ in range(rounds):
        for name, (call, batch, between) in cases.items():
            out = per_call[name]
            for _ in range(batches // rounds):
                t0 = clock()
                for _ in range(batch):
                    call(i)
                    i += 1
                out.append((clock() - t0) / batch / 1000)
                if between is not None:
                    between()
    figures = {}
    for name, values in per_call.items():
        values.sort()
        figures[name] = (statistics.median(values), values[int(len(values) * 0.99)])
    return figures


def timed(call: Callable[[int], object], batch: int, batches: int,
          between: Callable[[], None] | None = None) -> tuple[float, float]:
    return timed_all({"": (call, batch, between)}, batches, rounds=1)[""]


def _row(label: str, fig: tuple[float, float], extra: str = "") -> None:
    print(f"  {label:<44} median {fig[0]:6.2f} µs   p99 {fig[1]:6.2f} µs  {extra}")


def _step_call(tg: StepReporter) -> Callable[[int], object]:
    def call(i: int) -> object:
        return tg.step(i, i * 32, 181.5, comm_ms=20.25, data_wait_ms=1.5, step_ms=204.0,
                       loss=2.31)
    return call


def _json_call(send: Callable[[bytes], int]) -> Callable[[int], object]:
    """The same report as compact JSON: the format alternative, optional fields included."""
    pid = os.getpid()
    dumps = orjson.dumps

    def call(i: int) -> object:
        doc: dict[str, object] = {"v": 1, "job": "job-bench", "t": time.time_ns(), "pid": pid,
                                  "rank": 3, "world": 8, "step": i, "samples": i * 32,
                                  "compute_ms": 181.5}
        for key, value in (("comm_ms", 20.25), ("data_wait_ms", 1.5), ("step_ms", 204.0),
                           ("loss", 2.31), ("shard_offset", None)):
            if value is not None:
                doc[key] = value
        return send(dumps(doc))
    return call


def _in_process(tmp: Path) -> tuple[dict[str, tuple[float, float]], int, int]:
    """(a), bare, (b), pack alone and JSON, interleaved."""
    path = str(tmp / "a.sock")
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(path)
    rx.setblocking(False)
    tg = StepReporter("job-bench", 3, 8, dp_rank=3, pp_stage=0, tp_rank=0, socket_path=path,
                      heartbeat_interval_s=None)
    nobody = StepReporter("job-bench", 3, 8, socket_path=str(tmp / "nobody.sock"),
                          heartbeat_interval_s=None)
    _step_call(tg)(0)
    data = bytes(tg._buf)
    _drain(rx)
    tx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    tx.setblocking(False)
    tx.connect(path)
    send = tx.send
    buf = bytearray(data)
    pack = wire.STEP_VAR.pack_into
    off = wire.STEP_VAR_OFFSET

    def pack_only(i: int) -> None:
        pack(buf, off, 0xF0, i * 32, 0, 181.5, 20.25, 1.5, 204.0, 2.31, i, time.time_ns())

    drain = lambda: _drain(rx)  # noqa: E731
    step_call = _step_call(tg)
    section = tg.section
    data_s, fwd, bwd, opt = Section.DATA, Section.FORWARD, Section.BACKWARD, Section.OPTIMIZER

    def with_sections(i: int) -> object:  # a step's report with the step's four sections
        section(data_s)
        section(fwd)
        section(bwd)
        section(opt)
        return step_call(i)

    cases: dict[str, Case] = {
        "a": (step_call, SMALL_BATCH, drain),
        "a_sec": (with_sections, SMALL_BATCH, drain),
        "section": (lambda i: section(bwd), SMALL_BATCH, None),
        "bare": (lambda i: send(data), SMALL_BATCH, drain),
        "b": (_step_call(nobody), SMALL_BATCH, None),
        "pack": (pack_only, SMALL_BATCH, None),
        "json": (_json_call(send), SMALL_BATCH, drain),
    }
    try:
        figures = timed_all(cases, SMALL_BATCHES)
        return figures, tg.dropped, len(data)
    finally:
        nobody.close()
        tg.close()
        tx.close()
        rx.close()


_RECEIVER = textwrap.dedent("""
    import select, sys
    from trainguard.collectors.steps import StepReceiver
    rx = StepReceiver("bench-node", sys.argv[1])
    print("ready", flush=True)
    n = 0
    while True:
        select.select([rx.fileno()], [], [], 0.5)
        n += len(rx.drain().discrete)
        if not select.select([sys.stdin], [], [], 0)[0]:
            continue
        sys.stdin.readline()
        n += len(rx.drain().discrete)
        print(n, flush=True)
        break
""")


def _paced(call: Callable[[int], object], n: int, every_ns: int) -> tuple[float, float]:
    """Each call timed alone, one every ``every_ns``: the receiver has time to drain."""
    clock = time.perf_counter_ns
    out: list[float] = []
    next_at = clock()
    for i in range(n):
        while clock() < next_at:
            pass
        t0 = clock()
        call(i)
        out.append((clock() - t0) / 1000)
        next_at = t0 + every_ns
    out.sort()
    return statistics.median(out), out[int(len(out) * 0.99)]


Fig = tuple[float, float]
Concurrent = tuple[Fig, Fig, Fig, tuple[int, int], tuple[int, int], int]


def _concurrent(tmp: Path) -> Concurrent:
    """A real StepReceiver in another process; paced reports, then a flood."""
    path = str(tmp / "c.sock")
    proc = subprocess.Popen([sys.executable, "-c", _RECEIVER, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    try:
        with StepReporter("job-bench", 3, 8, socket_path=path,
                          heartbeat_interval_s=None) as tg:
            call = _step_call(tg)
            paced = _paced(call, PACED_N, PACED_EVERY_NS)
            paced_counts = tg.sent, tg.dropped
            data = bytes(tg._buf)
            time.sleep(0.1)  # let the receiver catch up
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as tx:
                tx.setblocking(False)
                tx.connect(path)
                send = tx.send
                bare_dropped = 0

                def bare(i: int) -> None:
                    nonlocal bare_dropped
                    try:
                        send(data)
                    except BlockingIOError:
                        bare_dropped += 1

                paced_bare = _paced(bare, PACED_N, PACED_EVERY_NS)
            time.sleep(0.05)
            flood = timed(call, BIG_BATCH, BIG_BATCHES)
            flood_counts = tg.sent - paced_counts[0], tg.dropped - paced_counts[1]
        time.sleep(0.2)
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        got = int(proc.stdout.readline())
    finally:
        proc.wait(timeout=10)
    return paced, paced_bare, flood, paced_counts, flood_counts, got


def main() -> None:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tg-bench-") as tmp_s:
        tmp = Path(tmp_s)
        figs, dropped_a, size = _in_process(tmp)
        paced, paced_bare, flood, (p_sent, p_dropped), (f_sent, f_dropped), got = \
            _concurrent(tmp)
    print(f"step() hook, {size}-byte datagrams (wire v{wire.VERSION}); per call:")
    _row("(a) receiver listening, drained per 8", figs["a"], f"dropped {dropped_a}")
    _row("(a) + the 4 section() calls of a step", figs["a_sec"])
    _row("section() alone", figs["section"])
    _row("bare sock.send of the same bytes", figs["bare"])
    _row("(b) no agent", figs["b"])
    _row(f"(a') + StepReceiver process, 1 per {PACED_EVERY_NS // 1000} µs", paced,
         f"dropped {p_dropped}/{p_sent + p_dropped}")
    _row("    bare sock.send, same pacing and receiver", paced_bare)
    _row("(a'') + StepReceiver process, flood", flood,
         f"dropped {f_dropped}/{f_sent + f_dropped} (queue full)")
    _row("struct pack_into alone (no send)", figs["pack"])
    _row("orjson dict + send (format alternative)", figs["json"])
    a, bare = figs["a"][0], figs["bare"][0]
    print(f"  ratio (a) / bare send: median {a / bare:.2f} (overhead {a - bare:.2f} µs); "
          f"orjson / (a): {figs['json'][0] / a:.2f}")
    print(f"  per report with its sections: median {figs['a_sec'][0]:.2f} µs (target <= 2)")
    print(f"  ratio (a') / its bare send: median {paced[0] / paced_bare[0]:.2f} "
          f"(overhead {paced[0] - paced_bare[0]:.2f} µs); the receiver decoded {got}")
    print(f"  ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
