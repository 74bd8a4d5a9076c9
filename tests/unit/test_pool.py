"""The pool is a pure fold of pool.unit events; spares are chosen by reservation, reachability
and topology."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.actuators.pool import PoolState, choose_spare, rebuild, reduce
from trainguard.events.codec import decode, encode, make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import PoolUnit, UnitState

JOB = "job-a"


def unit_event(unit: str, state: UnitState, *, job: str = JOB, rank: int | None = None,
               epoch: int | None = None, pid: int | None = None, node: str | None = "n1",
               labels: dict[str, str] | None = None, t: int = 1_000) -> Event:
    return make_event(PoolUnit(unit=unit, state=state, node=node, labels=labels or {},
                               rank=rank, epoch=epoch, pid=pid),
                      event_id=f"ev-{unit}-{state.value}-{t}", job_id=job, event_time=t,
                      source="test", subject=Subject(unit=unit))


def test_bound_then_fenced_keeps_the_epoch_and_forgets_the_pid() -> None:
    s = rebuild([
        unit_event("u0", UnitState.SPARE, labels={"rack": "r1"}),
        unit_event("u0", UnitState.BOUND, rank=2, epoch=3, pid=77),
    ])
    assert s.bound(JOB)[2].pid == 77
    s = reduce(s, unit_event("u0", UnitState.FENCED, rank=2, epoch=3, pid=77, t=2_000))
    assert s.bound(JOB) == {}
    assert s.units["u0"].state is UnitState.FENCED
    assert s.units["u0"].labels == {"rack": "r1"}  # carried over
    assert s.epoch(JOB, 2) == 3 and s.job_epoch(JOB) == 3


def test_other_event_types_leave_the_state_alone() -> None:
    from trainguard.rules.synth import heartbeat
    s = rebuild([unit_event("u0", UnitState.SPARE)])
    assert reduce(s, heartbeat(JOB, 0, 5)) is s


def test_spare_prefers_reserved_then_same_node_then_rack() -> None:
    s = rebuild([
        unit_event("old", UnitState.BOUND, rank=0, epoch=1, pid=5, node="n1",
                   labels={"rack": "r1", "switch": "s1"}),
        unit_event("far", UnitState.SPARE, node="n9", labels={"rack": "r9"}),
        unit_event("rack", UnitState.SPARE, node="n2", labels={"rack": "r1"}),
        unit_event("switch", UnitState.SPARE, node="n3", labels={"rack": "r2", "switch": "s1"}),
        unit_event("other-job", UnitState.SPARE, node="n1",
                   labels={"reserved_for": "job-b"}),
    ])
    old = s.bound(JOB)[0]
    choice = choose_spare(s, JOB, old, {})
    assert choice.unit is not None and choice.unit.name == "switch"  # reserved for b: never
    assert "same switch" in choice.reason
    choice = choose_spare(s, JOB, old, {"switch": "cannot write /ckpt"})
    assert choice.unit is not None and choice.unit.name == "rack"
    s = reduce(s, unit_event("mine", UnitState.SPARE, node="n9",
                             labels={"reserved_for": JOB}))
    choice = choose_spare(s, JOB, old, {})
    assert choice.unit is not None and choice.unit.name == "mine"


def test_no_spare_or_none_reachable_says_why() -> None:
    s = rebuild([unit_event("u", UnitState.SPARE, labels={"reserved_for": "job-b"})])
    assert choose_spare(s, JOB, None, {}).unit is None
    assert "no spare" in choose_spare(s, JOB, None, {}).reason
    s = reduce(s, unit_event("v", UnitState.SPARE))
    choice = choose_spare(s, JOB, None, {"v": "/ckpt: Permission denied"})
    assert choice.unit is None and "v: /ckpt: Permission denied" in choice.reason


STATES = st.sampled_from(list(UnitState))
EVENTS = st.lists(st.tuples(st.sampled_from(["u0", "u1", "u2"]), STATES,
                            st.integers(0, 3), st.integers(1, 9)), max_size=40)


@given(EVENTS)
@settings(max_examples=200, deadline=None)
def test_rebuild_from_the_log_equals_the_live_fold(items: list[tuple[str, UnitState, int,
                                                                     int]]) -> None:
    events = [unit_event(u, state, rank=r if state is UnitState.BOUND else None,
                         epoch=e if state is UnitState.BOUND else None, t=1000 + i)
              for i, (u, state, r, e) in enumerate(items)]
    live = PoolState()
    max_epoch: dict[int, int] = {}
    for ev in events:
        live = reduce(live, ev)
        p = ev.payload
        assert isinstance(p, PoolUnit)
        if p.state is UnitState.BOUND and p.rank is not None and p.epoch is not None:
            max_epoch[p.rank] = max(max_epoch.get(p.rank, 0), p.epoch)
        for rank, epoch in max_epoch.items():  # epochs never go back
            assert live.epoch(JOB, rank) == epoch
    replayed = rebuild(decode(encode(ev)) for ev in events)  # through the wire format
    assert dict(replayed.units) == dict(live.units)
    assert dict(replayed.epochs) == dict(live.epochs)
    for unit in live.units.values():  # a unit is bound to at most one rank, and only if bound
        assert (unit.rank is not None) == (unit.state is UnitState.BOUND)
