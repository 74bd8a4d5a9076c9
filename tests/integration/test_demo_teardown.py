"""The demo's teardown (`end_job`) on a real job: decide and the node agent go first, so the
ranks the actuator then fences are not seen exiting. No ``process.exit`` of the job after the
teardown began, and no incident left open by it."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import yaml

from trainguard.actuators.jobspec import ddp_job_doc
from trainguard.demo.whole_loop import ENDS, JOB, NODE, end_job, open_incidents
from trainguard.dev.kafka import KafkaBroker
from trainguard.drills.live import view
from trainguard.drills.logtail import LogTail, read_job_log
from trainguard.drills.stack import LocalStack
from trainguard.events.payloads import IncidentTransition, ProcessExit

WORLD = 2


def test_the_demo_teardown_leaves_no_exit_and_no_open_incident(
        kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    root = tmp_path / "stack"
    with LocalStack(root, prefix=f"t{uuid.uuid4().hex[:10]}", node=NODE, broker=kafka_broker,
                    say=lambda _line: None) as stack:
        stack.start_services(("agent", "streams", "decide", "incidents"))
        spec = root / "job.yaml"
        doc = ddp_job_doc(JOB, world_size=WORLD, spares=0, ckpt_dir=root / "ckpt", node=NODE,
                          agent_socket=stack.agent_socket, progress_dir=root / "progress",
                          log_dir=root / "ranks", allow_tmp_ckpt=True)
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        tail = LogTail(stack.config("trainguard-test"), JOB)
        tail.start()
        stack.start_actuator(JOB, spec, launch=True)
        try:
            deadline = time.monotonic() + 120
            while not (len(view(tail.events()).steps_at_epoch) == WORLD
                       and min(view(tail.events()).steps_at_epoch.values()) >= 3):
                assert time.monotonic() < deadline, "the job did not start"
                assert not stack.dead(), [s.tail() for s in stack.dead()]
                time.sleep(0.3)
        finally:
            tail.stop()
        ended_at = time.time_ns() // 1000
        end_job(stack, spec)
        assert "agent" not in stack.services  # stopped before the ranks were fenced
        events = read_job_log(stack.config("trainguard-test"), JOB, limit_s=30)
        exits = [e for e in events if isinstance(e.payload, ProcessExit)
                 and e.event_time >= ended_at]
        assert not exits, exits
        assert not open_incidents(stack)
        late = {e.payload.incident_id: e.payload.to_state for e in events
                if isinstance(e.payload, IncidentTransition) and e.event_time >= ended_at}
        assert all(state in ENDS for state in late.values()), late
