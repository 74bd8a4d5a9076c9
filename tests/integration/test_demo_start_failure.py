"""The demo's start-up wait against a real actuator whose ranks cannot start: it ends with the
rank's own error line as soon as the pool shows the rank gone, not after the 300 s wait."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from trainguard.actuators.jobspec import ddp_job_doc
from trainguard.demo.whole_loop import JOB, NODE, DemoError, wait_for_start
from trainguard.dev.kafka import KafkaBroker
from trainguard.drills.logtail import LogTail
from trainguard.drills.stack import LocalStack


def test_ranks_that_cannot_start_end_the_wait_with_their_own_error(
        kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    assert str(tmp_path).startswith("/tmp/")  # the checkpoint directory the ranks refuse
    root = tmp_path / "stack"
    with LocalStack(root, prefix=f"t{uuid.uuid4().hex[:10]}", node=NODE, broker=kafka_broker,
                    say=lambda _line: None) as stack:
        spec = root / "job.yaml"
        doc = ddp_job_doc(JOB, world_size=2, spares=0, ckpt_dir=tmp_path / "ckpt", node=NODE,
                          agent_socket=None, warm=False, log_dir=root / "ranks")
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        tail = LogTail(stack.config("trainguard-test"), JOB)
        tail.start()
        stack.start_actuator(JOB, spec, launch=True)
        try:
            with pytest.raises(DemoError) as failed:
                wait_for_start(stack, tail, root / "ranks", limit_s=120)
        finally:
            tail.stop()
    why = str(failed.value)
    assert "exited before the job started" in why, why  # not "gave up waiting"
    assert "does not survive the node" in why and "--allow-tmp-ckpt" in why, why
