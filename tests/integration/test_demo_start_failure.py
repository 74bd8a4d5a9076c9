"""The demo's start-up wait against a real actuator whose ranks cannot start: it ends with the
rank's own error line as soon as the rank is gone, not after the 300 s wait.

Measured from where (printed with ``-s``): the rank's exit is noticed within a poll of the
wait (0.2 s) plus the log's round trip. From the actuator's start the failure also includes
the actuator's own start-up and, for a warm job (the demo's: ``preload``), the warm launcher's
import of torch before it forks any rank (7-8 s of the total on a loaded 2-core machine)."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml

from trainguard.actuators.jobspec import ddp_job_doc
from trainguard.demo.whole_loop import JOB, NODE, DemoError, end_job, wait_for_start
from trainguard.dev.kafka import KafkaBroker
from trainguard.drills.logtail import LogTail
from trainguard.drills.stack import LocalStack

# after the failing rank's last line (its error) is written
NOTICED_WITHIN_S = 3.0
# after the actuator starts, ranks launched without the warm launcher (no torch import first)
COLD_FAILS_WITHIN_S = 10.0


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_ranks_that_cannot_start_end_the_wait_with_their_own_error(
        kafka_broker: KafkaBroker, tmp_path: Path, warm: bool) -> None:
    assert str(tmp_path).startswith("/tmp/")  # the checkpoint directory the ranks refuse
    root = tmp_path / "stack"
    with LocalStack(root, prefix=f"t{uuid.uuid4().hex[:10]}", node=NODE, broker=kafka_broker,
                    say=lambda _line: None) as stack:
        spec = root / "job.yaml"
        doc = ddp_job_doc(JOB, world_size=2, spares=0, ckpt_dir=tmp_path / "ckpt", node=NODE,
                          agent_socket=None, warm=warm, log_dir=root / "ranks")
        spec.write_text(yaml.safe_dump(doc, sort_keys=False))
        tail = LogTail(stack.config("trainguard-test"), JOB)
        tail.start()
        started = time.time()
        stack.start_actuator(JOB, spec, launch=True)
        try:
            with pytest.raises(DemoError) as failed:
                wait_for_start(stack, tail, root / "ranks", limit_s=120, world=2)
            ended = time.time()
        finally:
            tail.stop()
            end_job(stack, spec)  # the actuator's --teardown: the warm launcher goes too
    job_procs = [p for p in psutil.process_iter(["cmdline"])
                 if str(root) in " ".join(p.info["cmdline"] or ())]
    _, left = psutil.wait_procs(job_procs, timeout=15)  # the launcher ends on its SIGTERM
    assert not left, f"processes of the job still running: {[p.pid for p in left]}"
    why = str(failed.value)
    assert "exited before the job started" in why, why  # not "gave up waiting"
    assert "does not survive the node" in why and "--allow-tmp-ckpt" in why, why
    rank = re.search(r"rank (\d+) \(pid", why)
    assert rank, why
    exited = (root / "ranks" / f"{JOB}-rank{rank[1]}-e1.log").stat().st_mtime
    print(f"[start failure, {'warm' if warm else 'cold'}] {ended - started:.2f} s after the "
          f"actuator started, {ended - exited:.2f} s after the rank's error line")
    assert ended - exited <= NOTICED_WITHIN_S, (ended - exited, why)
    if not warm:
        assert ended - started <= COLD_FAILS_WITHIN_S, (ended - started, why)
