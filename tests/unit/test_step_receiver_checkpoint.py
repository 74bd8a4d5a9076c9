"""Checkpoint records through the real step socket: StepReporter.checkpoint -> StepReceiver ->
a CheckpointEvent the agent publishes as a ``checkpoint`` event; bad ones counted, the
reports around them kept."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from trainguard_sdk import StepReporter, wire

from trainguard.collectors.steps import StepReceiver
from trainguard.events.codec import decode, encode, make_event
from trainguard.events.payloads import CheckpointAction, CheckpointEvent, StepReport


@pytest.fixture
def rx() -> Iterator[StepReceiver]:
    d = Path(tempfile.mkdtemp(prefix="tgck", dir="/tmp"))
    with StepReceiver("node-a", d / "agent.sock") as receiver:
        yield receiver
    shutil.rmtree(d, ignore_errors=True)


def test_reporter_checkpoint_reaches_the_agent_as_a_checkpoint_event(rx: StepReceiver) -> None:
    with StepReporter("job-7", 3, 4, binding_epoch=2, socket_path=rx.path,
                      heartbeat_interval_s=None) as tg:
        assert tg.step(1, 64, 1.0)
        assert tg.checkpoint("written", 10, 640, "/data/ckpt/step-000000000010",
                             sha256="0f" * 32, size_bytes=1234, write_ms=12.5)
        assert tg.checkpoint("corrupt", 12, 768, "/data/ckpt/step-000000000012",
                             reason="state.pt: sha256 does not match the manifest")
        assert not tg.checkpoint("exploded", 1, 1, "/x")  # refused by the wire: counted
        assert tg.invalid == 1
    items = rx.drain().discrete
    payloads = [i.payload for i in items]
    assert isinstance(payloads[0], StepReport)
    written, corrupt = payloads[1], payloads[2]
    assert written == CheckpointEvent(action=CheckpointAction.WRITTEN, step=10,
                                      samples_consumed=640,
                                      path="/data/ckpt/step-000000000010", sha256="0f" * 32,
                                      size_bytes=1234, write_ms=12.5)
    assert isinstance(corrupt, CheckpointEvent) and corrupt.action == "corrupt"
    assert corrupt.reason == "state.pt: sha256 does not match the manifest"
    assert corrupt.sha256 is None and corrupt.size_bytes is None
    item = items[1]
    assert item.job_id == "job-7" and item.subject.rank == 3 and item.subject.node == "node-a"
    event = make_event(item.payload, event_id="event-0001", job_id=item.job_id,
                       event_time=item.event_time, source="agent", subject=item.subject)
    assert event.type == "checkpoint"
    assert decode(encode(event)).payload == written


def test_a_checkpoint_the_contract_refuses_is_counted_not_published(rx: StepReceiver) -> None:
    long_path = "/" + "p" * 300  # fits the wire (bytes), not the contract (256 chars)
    frames = [
        wire.encode_step(wire.StepFrame("job-1", 1, 0, 1, 1, 8, 1.0)),
        wire.encode_checkpoint(wire.CheckpointFrame("job-1", 2, 0, "loaded", 4, 32, long_path)),
        wire.encode_checkpoint(wire.CheckpointFrame("job-1", 3, 0, "loaded", 4, 32, "/ok",
                                                    write_ms=float("nan"))),
        wire.encode_checkpoint(wire.CheckpointFrame("job-1", 4, 0, "loaded", 4, 32, "/ok")),
    ]
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as tx:
        tx.connect(str(rx.path))
        for f in frames:
            tx.send(f)
        tx.send(frames[3][:3] + bytes([9]) + frames[3][4:])  # an unknown kind
    reading = rx.drain()
    kinds = [type(i.payload).__name__ for i in reading.discrete]
    assert kinds == ["StepReport", "CheckpointEvent"]
    assert reading.malformed == {"invalid_checkpoint": 2, "bad_kind": 1}
