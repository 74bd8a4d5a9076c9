"""A rank's departure through the agent's intake: the real step socket, the pump thread and the
process collector, as ``build_agent`` wires them. What a rank says before it ends goes with
its exit, and is published as a ``process.departure`` of its own."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trainguard.agent.build import _Intake, _registering
from trainguard.agent.pump import SocketPump
from trainguard.collectors.process import ProcessCollector, exits_of
from trainguard.collectors.steps import StepReceiver
from trainguard.events.payloads import (
    DepartureCause,
    Payload,
    ProcessDeparture,
    ProcessExit,
    StepReport,
)

RANK = textwrap.dedent("""
    import os, sys
    from trainguard_sdk import StepReporter
    tg = StepReporter("job-4", 2, 4, binding_epoch=5, socket_path=sys.argv[1],
                      heartbeat_interval_s=None)
    tg.step(1, 32, 1.0)
    if sys.argv[2] == "say":
        tg.leaving(3, "peer_lost", "lost a peer at step 2")
    os._exit(3)
""")


@pytest.fixture
def rx() -> Iterator[StepReceiver]:
    d = Path(tempfile.mkdtemp(prefix="tgdep", dir="/tmp"))
    with StepReceiver("node-a", d / "agent.sock") as receiver:
        yield receiver
    shutil.rmtree(d, ignore_errors=True)


def _rank_ends(rx: StepReceiver, mode: str) -> tuple[list[Payload], list[ProcessExit]]:
    processes = ProcessCollector("node-a", reap_children=True)
    pump = SocketPump(rx.fileno(), rx.drain_discrete).start()
    try:
        intake = _Intake(_registering(pump.take, processes))
        p = subprocess.Popen([sys.executable, "-c", RANK, str(rx.path), mode])
        deadline = time.monotonic() + 30
        items: list[Payload] = []
        exits: list[ProcessExit] = []
        while not exits and time.monotonic() < deadline:
            time.sleep(0.05)
            # as the agent's tick runs them: the intake, then the process collector's exits
            items += [i.payload for i in intake.collect(1).discrete]
            exits += exits_of(processes.poll_exits(2))
        p.wait(timeout=10)
        return items, exits
    finally:
        pump.stop()
        processes.close()


def test_a_departure_is_published_and_goes_with_the_exit(rx: StepReceiver) -> None:
    items, exits = _rank_ends(rx, "say")
    said = [p for p in items if isinstance(p, ProcessDeparture)]
    assert [type(p) for p in items] == [StepReport, ProcessDeparture]
    assert said[0].cause is DepartureCause.PEER_LOST and said[0].binding_epoch == 5
    [ex] = exits
    assert (ex.rank, ex.binding_epoch, ex.exit_code) == (2, 5, 3)
    assert (ex.declared_code, ex.declared_cause, ex.declared_reason) == (
        3, DepartureCause.PEER_LOST, "lost a peer at step 2")


def test_a_rank_that_says_nothing_has_an_exit_without_a_declaration(rx: StepReceiver) -> None:
    items, exits = _rank_ends(rx, "silent")
    assert [type(p) for p in items] == [StepReport]
    [ex] = exits
    assert ex.declared_cause is None and ex.declared_code is None
