"""What decide believes, offline (issue 11, reproduction 3): a forger who writes unsigned
commands under the idempotency keys derived from a visible verdict id, or unsigned outcomes
and pool events, changes nothing; the real ``raise_quota`` and escalation are still issued."""

from __future__ import annotations

import pytest

from tests import keys
from tests.unit.test_policy import CFG, JOB, S, outcome, unit, verdict
from trainguard.actuators import policy
from trainguard.actuators.decider import Decider, DeciderOptions
from trainguard.actuators.policy import Decision
from trainguard.actuators.signing import sign_event
from trainguard.bus.memory import MemoryBus
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import (
    Command,
    CommandAction,
    OutcomeStatus,
    UnitState,
    Verdict,
)

pytestmark = pytest.mark.unit


def forged_command(key: str, action: CommandAction, tier: int, t: int) -> Event:
    """What anyone with write access to the commands topic can write: no valid signature."""
    cmd = Command(command_id=derived_id("command", key), idempotency_key=key, action=action,
                  tier=tier, issued_at=t, issued_by="trainguard-decide", params={"rank": 2})
    return make_event(cmd, event_id=derived_id("command", key), job_id=JOB, event_time=t,
                      source="trainguard-decide", subject=Subject(rank=2))


def decider() -> Decider:
    return Decider(MemoryBus(),
                   DeciderOptions(key=keys.COMMAND, actuators=keys.ACTUATOR_PUBS, policy=CFG))


def feed(d: Decider, events: list[Event], now: int) -> list[Decision]:
    out: list[Decision] = []
    for ev in events:
        if d.wanted(ev):
            out += d.feed(ev, now)
    return out


def test_squatted_keys_do_not_stop_the_real_commands() -> None:
    v = verdict("straggler", 2, 10 * S)
    assert isinstance(v.payload, Verdict)
    vid = v.payload.verdict_id
    quota = policy.idempotency_key(JOB, vid, CommandAction.RAISE_QUOTA, 1)
    # a failed command escalates under a key derived from the failed command's key
    escalate = policy.idempotency_key(JOB, quota, CommandAction.ESCALATE,
                                      policy.ESCALATION_TIER)
    squat = [forged_command(quota, CommandAction.RAISE_QUOTA, 1, 10 * S),
             forged_command(escalate, CommandAction.ESCALATE, 0, 10 * S)]
    bound = [sign_event(keys.ACTUATOR, unit(f"u{r}", UnitState.BOUND, r, 100 + r, 1))
             for r in range(4)]

    # before: the policy counts any command on the topic as issued
    state = policy.PolicyState()
    for ev in [*bound, *squat, v]:
        state, out = policy.step(state, ev, 11 * S, CFG)
        assert out == []

    d = decider()
    issued = feed(d, [*bound, *squat, v], 11 * S)
    assert [(x.command.action, x.command.idempotency_key) for x in issued] == [
        (CommandAction.RAISE_QUOTA, quota)]
    # a forged outcome ("failed") is not believed; the actuator's signed one is
    fake = outcome(issued[0], OutcomeStatus.FAILED, 12 * S, "forged")
    assert feed(d, [fake], 12 * S) == []
    real = sign_event(keys.ACTUATOR, outcome(issued[0], OutcomeStatus.FAILED, 12 * S, "cgroup"))
    escalated = feed(d, [real], 12 * S)
    assert [(x.command.action, x.command.idempotency_key) for x in escalated] == [
        (CommandAction.ESCALATE, escalate)]


def test_a_forged_pool_unit_is_not_believed() -> None:
    """'u0 bound rank 0 epoch 1 pid V', then epoch 2: neither moves decide's pool."""
    d = decider()
    real = [sign_event(keys.ACTUATOR, unit(f"u{r}", UnitState.BOUND, r, 100 + r, 1))
            for r in range(2)]
    feed(d, real, S)
    forged = [unit("u0", UnitState.BOUND, 0, 4242, 1), unit("u0", UnitState.BOUND, 0, 4242, 2),
              unit("u9", UnitState.SPARE)]
    feed(d, forged, 2 * S)
    # signed with a key decide does not trust: not believed either
    feed(d, [sign_event(keys.COMMAND, unit("u8", UnitState.SPARE))], 2 * S)
    assert d.state.pool.epoch(JOB, 0) == 1
    assert d.state.pool.bound(JOB)[0].pid == 100
    assert set(d.state.pool.units) == {"u0", "u1"}
