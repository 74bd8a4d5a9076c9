"""`trainguard streams` on the real broker with imported histories: an OOM kill of a rank's
process (a kernel log imported with `trainguard import kmsg`) opens `oom_kill` at the rank and
resolves when the rank steps again; an external fault feed (`trainguard import faults`) opens
`external_fault` on arrival and resolves it at its end. Byte-identical to the engine's own
prompt-lane output in publish order."""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import arun
from tests.integration.test_streams_worker import (
    _assert_same_verdicts,
    _expected,
    _publish,
    _stop,
    _verdicts,
    _worker,
)
from trainguard.bus.config import KafkaConfig
from trainguard.events.envelope import Event
from trainguard.events.payloads import Verdict
from trainguard.offline.imports import fault_events, kmsg_events
from trainguard.rules import synth

T0 = 1_796_119_200_000_000  # 2026-12-01T10:00:00Z
S = 1_000_000


def _history() -> list[Event]:
    pids = {r: 4000 + r for r in range(4)}
    steps = list(synth.job_steps("job-oom", 4, 20, base_ms=100.0, step_us=S, start_us=T0,
                                 pids=pids))
    kill_t = T0 + 10 * S + 500_000
    # rank 2's process is killed: no reports from it until a new process (pid 5002) resumes
    steps = [e for e in steps if not (e.subject.rank == 2 and kill_t < e.event_time)]
    steps += list(synth.job_steps("job-oom", 4, 6, base_ms=100.0, step_us=S,
                                  start_us=T0 + 20 * S, first_step=20,
                                  pids={**pids, 2: 5002}))
    kmsg = kmsg_events("[ 10.500000] Out of memory: Killed process 4002 (python) total-vm:1kB, "
                       "anon-rss:1kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:1kB "
                       "oom_score_adj:0\n", name="k", node="node-0", job_id="job-oom",
                       boot_time_us=T0).events
    faults = fault_events(f"node,start,end,fault_class\nnode-7,{T0 // S + 3},{T0 // S + 9},"
                          f"power\nnode-7,{T0 // S + 15},,power\n", name="f", fmt="csv").events
    return sorted(steps + kmsg + faults, key=lambda e: (e.event_time, e.event_id))


def test_oom_and_external_faults_through_the_live_worker(kafka: KafkaConfig,
                                                         tmp_path: Path) -> None:
    events = _history()
    expected = _expected(events)
    want = sum(len(v) for v in expected.values())
    worker = _worker(kafka, tmp_path / "w")
    try:
        arun(_publish(kafka, events))
        got = arun(_verdicts(kafka, want, limit_s=90), timeout_s=120)
        assert worker.poll() is None, "the worker exited"
    finally:
        _stop(worker)
    _assert_same_verdicts(got, events)
    seen = [(v.job_id, v.payload.kind.value, v.payload.state.value, v.subject.rank,
             v.subject.node)
            for v in got if isinstance(v.payload, Verdict)
            and v.payload.kind in ("oom_kill", "external_fault")]
    assert seen.count(("job-oom", "oom_kill", "open", 2, "node-0")) == 1
    assert seen.count(("job-oom", "oom_kill", "resolved", 2, "node-0")) == 1
    # the second fault's start arrives while the first one's end waits in the reorder buffer
    # (no later record of node-7 passes it) and nothing after it moves node-7's watermark, so in
    # order it is not decided live (see the report); its urgent copy opens it at once when the
    # copy is read before the original (``_expected(copies_first=True)``), not after
    assert [s[2] for s in seen if s[0] == "node:node-7"] in (
        ["open", "resolved"], ["open", "open", "resolved"], ["open", "resolved", "open"])
