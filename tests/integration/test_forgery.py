"""Issue 11 on the real broker: what a writer without the keys can no longer do.

- Squatting: unsigned commands under the idempotency keys derived from a visible verdict id,
  written before the verdict: the real ``raise_quota`` and the ladder's escalation (tiers 1-3
  do not cure this straggler: the test never resolves its verdict) are still issued by
  ``trainguard decide`` and carried out by ``trainguard actuator``; the forgeries are
  dead-lettered by both, with the reason, and get no outcome.
- A forged pool: "u0 bound rank 0 epoch 1 pid V", then epoch 2, on the outcomes topic, and an
  actuator restart: the rebuilt pool does not hold them, and a step report of epoch 1 from pid
  V does not get V killed.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from tests import keys
from tests.integration.conftest import arun
from tests.integration.test_actuator_commands import dead_letters
from tests.integration.test_fencing import job_spec
from tests.integration.test_remediation import Loop, loop_factory, outcomes  # noqa: F401
from trainguard.actuators import policy
from trainguard.actuators.fencing import identify, stop_process
from trainguard.actuators.local import LocalBackend
from trainguard.actuators.service import Actuator, ActuatorOptions
from trainguard.bus.config import KafkaConfig
from trainguard.bus.kafka import KafkaBus
from trainguard.bus.producer import EventProducer
from trainguard.events.clock import now_us
from trainguard.events.codec import decode, make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    Command,
    CommandAction,
    PoolUnit,
    StepReport,
    UnitState,
)


def forged_command(job: str, key: str, action: CommandAction, tier: int) -> Event:
    t = now_us()
    cmd = Command(command_id=derived_id("command", key), idempotency_key=key, action=action,
                  tier=tier, issued_at=t, issued_by="trainguard-decide",
                  params={"rank": 2, "reason": "forged"})
    return make_event(cmd, event_id=derived_id("command", key), job_id=job, event_time=t,
                      source="trainguard-decide", subject=Subject(rank=2))


def send(kafka: KafkaConfig, events: list[Event]) -> None:
    async def go() -> None:
        async with EventProducer(kafka) as prod:
            for ev in events:
                await prod.send(ev)
    arun(go())


def test_squatted_keys_do_not_stop_the_real_quota_and_escalation(
        loop_factory: Callable[..., Loop]) -> None:  # noqa: F811
    # a straggler verdict that never resolves: the ladder. This job reports no checkpoint
    # load, so after each restart the ladder waits out the outcome timeout instead
    loop = loop_factory(window_s=1.5, outcome_timeout_s=15.0)
    loop.wait_for("the job to run", lambda: len(loop.pids(1)) == 4
                  and len(loop.progress()) > 20, 60)
    vid = derived_id("straggler", loop.job, 2, "visible")
    quota = policy.idempotency_key(loop.job, vid, CommandAction.RAISE_QUOTA, 1)
    escalate = policy.idempotency_key(loop.job, vid, CommandAction.ESCALATE,
                                      policy.ESCALATION_TIER)
    send(loop.kafka, [forged_command(loop.job, quota, CommandAction.RAISE_QUOTA, 1),
                      forged_command(loop.job, escalate, CommandAction.ESCALATE, 0)])
    time.sleep(1.0)  # both services have read the forgeries before the verdict comes
    loop.publish_verdict("straggler", 2, {"ratio": 3.2}, vid=vid)
    loop.wait_for("the escalation carried out",
                  lambda: ("escalate", "done") in outcomes(loop.log()), 90)
    events = loop.log()
    signed = {e.payload.idempotency_key: e.payload.action for e in events
              if isinstance(e.payload, Command) and e.payload.signature
              and e.payload.signature.startswith("ed25519:")}
    assert signed[quota] is CommandAction.RAISE_QUOTA
    assert signed[escalate] is CommandAction.ESCALATE
    done = outcomes(events)
    assert done[:2] == [("raise_quota", "accepted"), ("raise_quota", "done")]
    assert done[-2:] == [("escalate", "accepted"), ("escalate", "done")]
    letters = arun(dead_letters(loop.kafka, 4))
    refused = sorted((lt.consumer, decode(lt.original_value()).payload.idempotency_key)  # type: ignore[attr-defined]
                     for lt in letters)
    assert refused == sorted([("actuator", quota), ("actuator", escalate),
                              ("decide", quota), ("decide", escalate)])
    assert all(lt.reason == "payload.signature: command unsigned (got None)" for lt in letters)


def test_a_forged_pool_is_not_believed_by_a_restarted_actuator(kafka: KafkaConfig,
                                                               tmp_path: Path) -> None:
    spec = job_spec(tmp_path, world=1, ignore_term=False)
    job = spec.job_id
    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    V = victim.pid

    def forged_pool(epoch: int) -> Event:
        unit = PoolUnit(unit="u0", state=UnitState.BOUND, rank=0, epoch=epoch, pid=V)
        return make_event(unit, event_id=f"forged-pool-{uuid.uuid4().hex[:8]}", job_id=job,
                          event_time=now_us(), source="trainguard-actuator",
                          subject=Subject(unit="u0", rank=0))

    def actuator() -> Actuator:
        return Actuator(KafkaBus(kafka), ActuatorOptions(job=spec, key=keys.COMMAND_PUB,
                                               signer=keys.ACTUATOR,
                                               state_dir=tmp_path / "state", launch=True),
                        LocalBackend(tmp_path / "logs", use_cgroups=False))

    async def serve(act: Actuator, until: Callable[[], bool], then: list[Event]) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(act.run(stop))
        while not until():
            assert not task.done(), task.exception()
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)  # its task consumer is reading from now
        async with EventProducer(kafka) as prod:
            for ev in then:
                await prod.send(ev)
        await asyncio.sleep(3.0)
        stop.set()
        await task

    first = actuator()
    second = actuator()
    try:
        arun(serve(first, lambda: first.executor is not None
                   and bool(first.executor.pool.bound(job)), [forged_pool(1), forged_pool(2)]),
             timeout_s=60)
        real_pid = first.executor.pool.bound(job)[0].pid if first.executor else None
        report = make_event(StepReport(rank=0, world_size=1, step=1, samples_consumed=8,
                                       binding_epoch=1, compute_ms=1.0, pid=V),
                            event_id=f"report-{uuid.uuid4().hex[:8]}", job_id=job,
                            event_time=now_us(), source="forger", subject=Subject(rank=0))
        arun(serve(second, lambda: second.executor is not None, [report]), timeout_s=60)
        assert second.executor is not None
        pool = second.executor.pool
        assert pool.epoch(job, 0) == 1 and V not in pool.launched
        assert pool.bound(job)[0].pid == real_pid != V
        assert victim.poll() is None, "the forged pool got an unrelated process killed"
        letters = arun(dead_letters(kafka, 2))
        assert len(letters) == 2 and {lt.consumer for lt in letters} == {"actuator-rebuild"}
        assert {lt.reason for lt in letters} == {"payload.signature: pool.unit unsigned "
                                                 "(got None)"}
    finally:
        victim.kill()
        for act in (first, second):
            if act.executor is not None:
                for rep in act.executor.replicas().values():
                    ident = identify(rep.pid)  # test cleanup: whatever that pid is now
                    if ident is not None:
                        stop_process(ident, 0.1)
