"""decide as a group on the real broker (issue 15): two ``trainguard decide`` processes in one
consumer group split the jobs by commands partition; the one holding partitions is SIGKILLed
(or SIGSTOPped past its session) while more failures come in; the other takes its jobs over once
the group's session times out. Every job gets its one migrate: none lost, none written twice.
And in-process, an instance that still believes it holds its partitions after the group gave
them away (what a paused process sees for a moment when it runs again) is fenced by the
broker: its commands never reach the topic."""

from __future__ import annotations

import asyncio
import dataclasses
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
from tests.integration.conftest import arun, read_events
from tests.integration.test_forgery import send
from tests.unit.test_decide_standby import OPTS, job_events, until
from trainguard.actuators.decider import Decider
from trainguard.bus.config import KafkaConfig
from trainguard.bus.kafka import KafkaBus
from trainguard.bus.lease import KafkaLease, key_partition
from trainguard.bus.producer import EventProducer
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


JOBS = {p: [f"job-{i}" for i in range(200) if key_partition(f"job-{i}".encode(), 3) == p]
        for p in (0, 1, 2)}


def two_instances(kafka: KafkaConfig, logs: list[Path],
                  procs: list[subprocess.Popen[bytes]]) -> list[str]:
    """Start ``a``, then ``b`` in the same group; one failure per partition's first job, each
    migrated once: the jobs."""
    group = f"{kafka.topic_prefix}-decide"
    procs.append(decide(kafka, group, logs[0]))
    wait_for("the first instance to hold every partition",
             lambda: held(logs[0]) == {0, 1, 2}, 60, logs)
    procs.append(decide(kafka, group, logs[1]))
    wait_for("the group to split the partitions", lambda: split(logs), 60, logs)
    first = [JOBS[p][0] for p in (0, 1, 2)]
    send(kafka, [e for job in first for e in job_events(job, now_us())])
    wait_for("a migrate for each of the first jobs", lambda: len(migrates(kafka)) >= 3, 60,
             logs)
    return first


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def test_a_killed_active_decide_loses_no_command_and_none_is_written_twice(
        kafka: KafkaConfig, tmp_path: Path) -> None:
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        first = two_instances(kafka, logs, procs)
        a = procs[0]
        of_a = held(logs[0]) or set()
        a.send_signal(signal.SIGKILL)  # no goodbye: the group finds out by its session timeout
        killed = time.monotonic()
        a.wait(10)
        later = [JOBS[p][1] for p in (0, 1, 2)]
        send(kafka, [e for job in later for e in job_events(job, now_us())])
        wait_for("the second instance to take over", lambda: held(logs[1]) == {0, 1, 2}, 60,
                 logs)
        wait_for("a migrate for every job", lambda: len(migrates(kafka)) >= 6, 60, logs)
        print(f"every migrate on the topic {time.monotonic() - killed:.1f} s after the SIGKILL")
        time.sleep(3.0)  # anything written twice would be there by now
        got = migrates(kafka)
    finally:
        stop_all(procs)
    assert sorted(job for job, _ in got) == sorted(first + later), got  # each once
    assert len({key for _, key in got}) == 6
    assert of_a and of_a != {0, 1, 2}  # the killed one was active for some jobs only


def test_a_paused_active_decide_is_fenced_when_it_runs_again(
        kafka: KafkaConfig, tmp_path: Path) -> None:
    """SIGSTOP past the group's session: ``b`` takes every partition over and migrates the
    new failures. On SIGCONT ``a`` reads those failures too; whether its lease hears of the
    rebalance first (as in the runs so far) or its fenced producer is refused (the test
    below), nothing of it reaches the topic."""
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        first = two_instances(kafka, logs, procs)
        a = procs[0]
        of_a = held(logs[0]) or set()
        a.send_signal(signal.SIGSTOP)
        wait_for("the second instance to take over", lambda: held(logs[1]) == {0, 1, 2}, 60,
                 logs)
        later = [JOBS[p][1] for p in sorted(of_a)]
        send(kafka, [e for job in later for e in job_events(job, now_us())])
        wait_for("a migrate for every job", lambda: len(migrates(kafka)) >= 3 + len(later),
                 60, logs)
        said = len(HELD.findall(logs[0].read_text(errors="replace")))
        a.send_signal(signal.SIGCONT)
        wait_for("the paused instance to hear of the rebalance",
                 lambda: len(HELD.findall(logs[0].read_text(errors="replace"))) > said, 60, logs)
        time.sleep(3.0)  # anything it wrote would be there by now
        got = migrates(kafka)
    finally:
        stop_all(procs)
    assert of_a and of_a != {0, 1, 2}
    assert sorted(job for job, _ in got) == sorted(first + later), got  # each once


class ZombieLease(KafkaLease):
    """A member that leaves the group on ``zombie()`` but goes on believing it holds what it
    held: a paused process's view between SIGCONT and its first poll."""

    belief: frozenset[int] | None = None

    async def zombie(self) -> None:
        self.belief = self.held()
        await self.stop()

    def held(self) -> frozenset[int]:
        return self.belief if self.belief is not None else super().held()


class ZombieBus(KafkaBus):
    def lease(self, role: TopicRole, *, group_id: str, name: str) -> ZombieLease:
        return ZombieLease(self.config, self.names.name(role), group_id=group_id, name=name)


def test_an_instance_that_still_believes_it_holds_its_partitions_is_fenced(
        kafka: KafkaConfig) -> None:
    opts = dataclasses.replace(OPTS, group_id=f"{kafka.topic_prefix}-decide")
    job = JOBS[0][0]

    async def go() -> tuple[set[int], set[int], bool]:
        old, new = Decider(ZombieBus(kafka), opts), Decider(KafkaBus(kafka), opts)
        stops = [asyncio.Event(), asyncio.Event()]
        tasks = [asyncio.create_task(old.run(stops[0]))]
        try:
            assert await until(lambda: old.lease is not None and old.active(job), 60)
            assert isinstance(old.lease, ZombieLease)
            await old.lease.zombie()  # out of the group, still "holding" every partition
            tasks.append(asyncio.create_task(new.run(stops[1])))
            assert await until(lambda: new.lease is not None and new.active(job), 60)
            async with EventProducer(kafka) as prod:
                for ev in job_events(job, now_us()):
                    await prod.send(ev)
            assert await until(lambda: bool(old.fenced_out), 60)
            await asyncio.sleep(2.0)
            return set(old.fenced_out), set(new.fences), old.active(job)
        finally:
            for s in stops:
                s.set()
            await asyncio.gather(*tasks)

    fenced_out, fences_of_new, still_active = arun(go(), timeout_s=150)
    assert fenced_out == {0} and fences_of_new == {0, 1, 2} and not still_active
    assert migrates(kafka) == [(job, migrates(kafka)[0][1])]  # one, from ``new``
