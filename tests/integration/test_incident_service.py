"""The incident service against the real broker: a recorded kill -> migrate -> resume log in,
incident transitions out (exactly the rebuild's), nothing published twice after a restart;
then replay from the topics and from an export reproduces them exactly, and a stricter rules
file is reported as a what-if difference."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests import keys
from tests.integration.conftest import arun
from trainguard.actuators.signing import sign_log
from trainguard.bus.config import KafkaConfig
from trainguard.bus.kafka import KafkaBus
from trainguard.bus.producer import EventProducer
from trainguard.events.envelope import Event
from trainguard.events.topics import TopicRole
from trainguard.incidents import IncidentSettings, rebuild
from trainguard.incidents.query import canonical
from trainguard.incidents.service import ServiceStats, serve
from trainguard.incidents.source import read_log_file, read_topics, write_log
from trainguard.incidents.synth import incident_log
from trainguard.replay import replay_log
from trainguard.rules import load_default_rules, parse_rules

LOG = incident_log()
SETTINGS = IncidentSettings()
DEFAULT_YAML = (Path(__file__).resolve().parents[2] / "rules/default.yaml").read_text()


async def publish(cfg: KafkaConfig, events: list[Event]) -> None:
    async with EventProducer(cfg) as producer:
        futures = [await producer.enqueue(e) for e in events]
        for f in futures:
            await f


async def transitions(cfg: KafkaConfig) -> list[Event]:
    got = await read_topics(cfg, [TopicRole.INCIDENTS])
    return [e for e in got.events if e.type == "incident.transition"]


async def run_service(cfg: KafkaConfig, until: int, limit_s: float = 30.0,
                      restart: bool = False) -> ServiceStats:
    """Run the service until the incidents topic holds ``until`` transitions (on a restart:
    until it has decided all ``until`` again), then stop it."""
    stop = asyncio.Event()
    stats = ServiceStats()
    task = asyncio.create_task(serve(KafkaBus(cfg), settings=SETTINGS, idle_flush_s=1.0, stop=stop,
                                     stats=stats))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    try:
        while loop.time() < deadline and not task.done():
            if restart and stats.already_published + stats.published >= until:
                break
            if not restart and len(await transitions(cfg)) >= until and stats.consumed:
                break
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await task
    return stats


def test_service_publishes_the_rebuilt_transitions_once_and_replay_reproduces_them(
        kafka: KafkaConfig, tmp_path: Path) -> None:
    expected = rebuild(LOG, SETTINGS)
    assert len(expected) == 9
    arun(publish(kafka, LOG))

    first = arun(run_service(kafka, until=len(expected)))
    got = arun(transitions(kafka))
    assert sorted(canonical(t) for t in got) == sorted(canonical(t) for t in expected)
    assert first.published == len(expected)

    # restart: the state is rebuilt from the log, nothing is published again
    again = arun(run_service(kafka, until=len(expected), limit_s=20.0, restart=True))
    assert again.published == 0 and again.already_published == len(expected)
    assert again.conflicts == 0
    assert len(arun(transitions(kafka))) == len(expected)

    # replay from the topics: the recorded verdicts and incidents, exactly
    log = arun(read_topics(kafka)).events
    result = replay_log(log, load_default_rules(), settings=SETTINGS)
    assert result.incidents_recorded and result.exact and not result.what_if
    assert result.verdicts.same == 4 and len(result.incidents.same) == 2

    # ... and from an export of them
    export = tmp_path / "log.jsonl"
    with export.open("wb") as fh:
        assert write_log(log, fh) == len(LOG) + len(expected)
    from_file = replay_log(read_log_file(export), load_default_rules(), settings=SETTINGS)
    assert from_file.exact and len(from_file.incidents.same) == 2

    # what-if: a stricter straggler threshold, the tier-1 incident would vanish
    strict = parse_rules(DEFAULT_YAML.replace("effect_levels: [1.1, 1.3, 1.6, 2.0]",
                                              "effect_levels: [1.8]")
                         .replace("threshold_ratio: 1.15", "threshold_ratio: 1.8"), "strict.yaml")
    what_if = replay_log(log, strict, settings=SETTINGS)
    assert what_if.what_if and not what_if.incidents.exact
    assert [s.opened_by for s in what_if.incidents.vanish] == ["warning straggler verdict opened"]


def test_the_cli_service_and_list_against_the_broker(kafka: KafkaConfig) -> None:
    """`trainguard incident serve` as a process (stopped by SIGTERM), then `incident list` and
    `replay` reading the topics."""
    arun(publish(kafka, sign_log(LOG, keys.COMMAND, keys.ACTUATOR)))
    env = {**os.environ, "TRAINGUARD_KAFKA_BOOTSTRAP": kafka.bootstrap,
           "TRAINGUARD_KAFKA_TOPIC_PREFIX": kafka.topic_prefix}
    cli = [sys.executable, "-m", "trainguard.cli.main"]
    proc = subprocess.Popen([*cli, "incident", "serve", "--idle-flush-s", "1"],
                            env={**env, **keys.env()},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and len(arun(transitions(kafka))) < 9:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"published 9" in out
    listing = subprocess.run([*cli, "incident", "list"], env=env, capture_output=True,
                             timeout=60, check=True).stdout.decode()
    assert listing.count("[recorded]") == 2, listing
    replay = subprocess.run([*cli, "replay"], env=env, capture_output=True, timeout=60)
    assert replay.returncode == 0 and b"REPRODUCED EXACTLY" in replay.stdout, replay.stdout
