"""`incident serve` restart: from its snapshot vs from earliest, on one in-memory log.

    .venv/bin/python -m bench.bench_incident_restart [EVENTS]   (default 200000)

The log is the synthetic incident scenario (bench: every job a copy under its own name and
ids) repeated until it holds EVENTS records, on the in-memory bus. One service runs to the end
and stops cleanly (writing its snapshot); then, in the same run, a restart with the snapshot
and a restart without it (``snapshots=None``: every input topic from earliest) each serve until
they have caught up with the log (every input record committed, nothing left buffered). Prints
both times, their ratio, the snapshot's size and the time to write it. In memory, reading the
log costs only decoding; on Kafka the rebuild also fetches the whole log over the network, so
this understates the gap. Nothing is asserted.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

from trainguard.bus.memory import MemoryBus
from trainguard.events.envelope import Event
from trainguard.events.ids import derived_id
from trainguard.incidents import IncidentSettings, LiveIncidents
from trainguard.incidents.service import INPUT_ROLES, ServiceStats, Snapshots, serve
from trainguard.incidents.snapshot import Snapshot, SnapshotStore, encode_snapshot
from trainguard.incidents.synth import Scenario, incident_log

GROUP = "bench-incidents"
SETTINGS = IncidentSettings()


def log_of(n: int) -> list[Event]:
    out: list[Event] = []
    i = 0
    while len(out) < n:
        job = f"job-{i:04d}"
        out += [e.model_copy(update={"event_id": derived_id("bench", job, e.event_id)})
                for e in incident_log(Scenario(job=job))]
        i += 1
    return out[:n]


async def until_caught_up(bus: MemoryBus, snapshots: Snapshots | None,
                          idle_flush_s: float) -> tuple[float, ServiceStats]:
    """Seconds from serve() to caught up (state rebuilt or restored, the consumer following,
    every input record committed)."""
    live = LiveIncidents(SETTINGS)
    stats = ServiceStats()
    stop = asyncio.Event()
    t0 = time.perf_counter()
    task = asyncio.create_task(serve(bus, settings=SETTINGS, group=GROUP, stop=stop,
                                     stats=stats, live=live, snapshots=snapshots,
                                     idle_flush_s=idle_flush_s, poll_ms=5))
    while not (stats.following
               and bus.committed_offset(GROUP, INPUT_ROLES) == bus.end_offset(INPUT_ROLES)):
        await asyncio.sleep(0.001)
    took = time.perf_counter() - t0
    stop.set()
    await task
    return took, stats


async def main(n: int) -> None:
    events = log_of(n)
    bus = MemoryBus()
    await bus.publish(events)
    print(f"log: {len(events)} events ({bus.end_offset(INPUT_ROLES)} on the input topics), "
          f"{len({e.job_id for e in events})} jobs")
    with tempfile.TemporaryDirectory() as tmp:
        snapshots = Snapshots(SnapshotStore(Path(tmp)), interval_s=3600, every_batches=10**9)
        first, _ = await until_caught_up(bus, snapshots, idle_flush_s=3600)  # stop: writes it
        size = snapshots.store.path.stat().st_size
        snap = snapshots.store.read()
        assert snap is not None
        live = LiveIncidents(SETTINGS)
        live.restore(snap.state)
        t0 = time.perf_counter()
        data = encode_snapshot(Snapshot(snap.identity, snap.offsets, live.snapshot()))
        snapshots.store.write(data)
        write_s = time.perf_counter() - t0
        restored, rs = await until_caught_up(bus, snapshots, idle_flush_s=3600)
        rebuilt, bs = await until_caught_up(bus, None, idle_flush_s=3600)
    assert rs.restored and not bs.restored
    print(f"first start (rebuild, no snapshot yet): {first:.2f} s")
    print(f"snapshot: {size / 1e6:.1f} MB, encode + write (fsync) {write_s:.2f} s")
    print(f"restart from earliest: {rebuilt:.2f} s (consumed {bs.consumed})")
    print(f"restart from snapshot: {restored:.2f} s (consumed {rs.consumed})")
    print(f"ratio earliest/snapshot {rebuilt / restored:.1f}x")


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 200_000))
