"""The incident service across a real broker outage: stopped for longer than the consumer
group's session, the broker comes back, the step reports spooled meanwhile arrive before the
verdicts and commands about the same time, and the service still publishes every transition
the rebuild makes from the whole log (the drills' broker-outage scenario saw the live service
drop such verdicts as later than its lateness bound, and its incidents differ from replay)."""

from __future__ import annotations

import asyncio

from tests.integration.conftest import arun
from tests.integration.test_incident_service import SETTINGS, publish, transitions
from trainguard.bus.config import KafkaConfig
from trainguard.bus.kafka import KafkaBus
from trainguard.dev.kafka import KafkaBroker
from trainguard.incidents import rebuild
from trainguard.incidents.query import canonical
from trainguard.incidents.service import ServiceStats, serve
from trainguard.incidents.synth import incident_log

LOG = incident_log()
OUTAGE_S = 20.0  # as the drill; longer than the group's session (10 s): membership expires


def test_the_service_goes_on_after_a_broker_outage(kafka: KafkaConfig,
                                                   kafka_broker: KafkaBroker) -> None:
    expected = rebuild(LOG, SETTINGS)
    half = len(LOG) // 2

    async def scenario() -> tuple[list[str], ServiceStats, str]:
        await publish(kafka, LOG[:half])
        stop = asyncio.Event()
        stats = ServiceStats()
        task = asyncio.create_task(serve(KafkaBus(kafka), settings=SETTINGS, idle_flush_s=1.0,
                                         stop=stop, stats=stats))
        loop = asyncio.get_running_loop()
        try:
            deadline = loop.time() + 30
            while stats.consumed < half and loop.time() < deadline:
                await asyncio.sleep(0.2)
            await asyncio.sleep(2.0)  # it has joined its group and is polling
            await asyncio.to_thread(kafka_broker.stop)
            await asyncio.sleep(OUTAGE_S)
            await asyncio.to_thread(kafka_broker.start)
            # as after the drills' outage: the agents' spooled step reports first, the
            # verdicts and commands (streams and decide catching up) behind them
            rest = LOG[half:]
            await publish(kafka, [e for e in rest if e.type == "step.report"])
            await asyncio.sleep(3.0)
            await publish(kafka, [e for e in rest if e.type != "step.report"])
            deadline = loop.time() + 90
            got: list[str] = []
            while loop.time() < deadline and not task.done():
                got = [canonical(t).decode() for t in await transitions(kafka)]
                if len(got) >= len(expected):
                    break
                await asyncio.sleep(1.0)
            where = "".join(str(f) for f in task.get_stack()) if not task.done() else "done"
        finally:
            stop.set()
            await asyncio.wait_for(task, 60)
        return got, stats, where

    got, stats, where = arun(scenario(), timeout_s=240)
    # every transition of the rebuild was published (nothing else: no record came late
    # enough to make one the rebuild does not make)
    assert sorted(got) == sorted(canonical(t).decode() for t in expected), (stats, where)
