"""decide as a group on the real broker (issue 15): two ``trainguard decide`` processes in one
consumer group split the jobs by commands partition; the one holding partitions is SIGKILLed
while more failures come in; the other takes its jobs over once the group's session times out.
Every job gets its one migrate: none lost, none written twice."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import keys
from tests.integration.conftest import read_events
from tests.integration.test_forgery import send
from tests.unit.test_decide_standby import job_events
from trainguard.bus.config import KafkaConfig
from trainguard.bus.lease import key_partition
from trainguard.events.clock import now_us
from trainguard.events.payloads import Command, CommandAction
from trainguard.events.topics import TopicRole

pytestmark = pytest.mark.integration
HELD = re.compile(r"decide: holds partitions \[([0-9, ]*)\]")


def decide(kafka: KafkaConfig, group: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, **keys.env()}
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "trainguard.cli.main", "decide", "--bootstrap",
             kafka.bootstrap, "--prefix", kafka.topic_prefix, "--group-id", group,
             "--settle-s", "0"], stdout=out, stderr=subprocess.STDOUT, env=env)


def held(log: Path) -> set[int] | None:
    """The partitions the process said it holds last (None: it said nothing yet)."""
    found = HELD.findall(log.read_text(errors="replace"))
    if not found:
        return None
    return {int(x) for x in found[-1].split(",") if x.strip()}


def split(logs: list[Path]) -> bool:
    """Both hold partitions, together every one."""
    a, b = held(logs[0]), held(logs[1])
    return bool(a) and bool(b) and (a or set()) | (b or set()) == {0, 1, 2}


def wait_for(what: str, ok: Callable[[], bool], limit_s: float, logs: list[Path]) -> None:
    deadline = time.monotonic() + limit_s
    while not ok():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                              for p in logs)
            pytest.fail(f"timed out waiting for {what}\n{tails}", pytrace=False)
        time.sleep(0.2)


def migrates(kafka: KafkaConfig) -> list[tuple[str, str]]:
    """(job, idempotency key) of every migrate record on the commands topic."""
    return [(e.job_id, e.payload.idempotency_key)
            for e in read_events(kafka, [TopicRole.COMMANDS], idle_ms=500)
            if isinstance(e.payload, Command) and e.payload.action is CommandAction.MIGRATE]


def test_a_killed_active_decide_loses_no_command_and_none_is_written_twice(
        kafka: KafkaConfig, tmp_path: Path) -> None:
    group = f"{kafka.topic_prefix}-decide"
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    a = decide(kafka, group, logs[0])
    procs = [a]
    try:
        wait_for("the first instance to hold every partition",
                 lambda: held(logs[0]) == {0, 1, 2}, 60, logs)
        b = decide(kafka, group, logs[1])
        procs.append(b)
        wait_for("the group to split the partitions", lambda: split(logs), 60, logs)
        of_a = held(logs[0]) or set()
        jobs = {p: [f"job-{i}" for i in range(200) if key_partition(f"job-{i}".encode(), 3) == p]
                for p in (0, 1, 2)}
        first = [jobs[p][0] for p in (0, 1, 2)]
        send(kafka, [e for job in first for e in job_events(job, now_us())])
        wait_for("a migrate for each of the first jobs", lambda: len(migrates(kafka)) >= 3, 60,
                 logs)
        a.send_signal(signal.SIGKILL)  # no goodbye: the group finds out by its session timeout
        killed = time.monotonic()
        a.wait(10)
        later = [jobs[p][1] for p in (0, 1, 2)]
        send(kafka, [e for job in later for e in job_events(job, now_us())])
        wait_for("the second instance to take over", lambda: held(logs[1]) == {0, 1, 2}, 60,
                 logs)
        wait_for("a migrate for every job", lambda: len(migrates(kafka)) >= 6, 60, logs)
        print(f"every migrate on the topic {time.monotonic() - killed:.1f} s after the SIGKILL")
        time.sleep(3.0)  # anything written twice would be there by now
        got = migrates(kafka)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
    assert sorted(job for job, _ in got) == sorted(first + later), got  # each once
    assert len({key for _, key in got}) == 6
    assert of_a and of_a != {0, 1, 2}  # the killed one was active for some jobs only
