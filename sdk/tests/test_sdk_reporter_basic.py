"""The reporter against a plain Unix datagram socket, decoded with the SDK's own wire module."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from trainguard_sdk import StepReporter, wire


def test_step_heartbeat_and_checkpoint_reach_the_socket(
        agent_socket: tuple[Path, socket.socket]) -> None:
    path, rx = agent_socket
    with StepReporter("job-9", 1, 4, dp_rank=1, binding_epoch=3, socket_path=path,
                      heartbeat_interval_s=None) as tg:
        assert tg.step(5, 160, 12.5, comm_ms=3.0, loss=0.5)
        assert tg.heartbeat("checkpoint")
        assert tg.checkpoint("written", 5, 160, "/ckpt/step-000000000005", size_bytes=10)
    frames = [wire.decode(rx.recv(wire.MAX_DATAGRAM)) for _ in range(4)]
    step, beat, ck, idle = frames
    assert isinstance(step, wire.StepFrame)
    assert (step.job_id, step.rank, step.world_size, step.dp_rank, step.binding_epoch) == (
        "job-9", 1, 4, 1, 3)
    assert (step.step, step.samples_consumed, step.compute_ms, step.comm_ms, step.loss) == (
        5, 160, 12.5, 3.0, 0.5)
    assert step.pid == os.getpid() and step.tp_rank is None
    assert isinstance(beat, wire.HeartbeatFrame) and (beat.phase, beat.step) == ("checkpoint", 5)
    assert isinstance(ck, wire.CheckpointFrame) and (ck.action, ck.size_bytes) == ("written", 10)
    assert isinstance(idle, wire.HeartbeatFrame) and idle.phase == "idle"


def test_no_agent_drops_and_never_raises(tmp_path: Path) -> None:
    with StepReporter("job-9", 0, 1, socket_path=tmp_path / "none.sock",
                      heartbeat_interval_s=None) as tg:
        assert not tg.step(1, 1, 1.0)
        assert not tg.step(-1, 1, 1.0)  # cannot be encoded: counted, not raised
    assert tg.sent == 0 and tg.dropped >= 2 and tg.invalid == 1
