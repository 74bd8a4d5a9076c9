"""The pool is a pure fold of pool.unit events; spares are chosen by reservation, reachability
and topology."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.actuators.pool import (
    PoolState,
    choose_spare,
    choose_spares,
    domains,
    failed_domains,
    rebuild,
    reduce,
)
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
    assert not choose_spare(s, JOB, None, {}).storage_blocked
    choice = choose_spare(s, JOB, None, {"v": "/ckpt: Permission denied"})
    assert choice.unit is None and "v: /ckpt: Permission denied" in choice.reason
    assert choice.storage_blocked  # only the storage is in the way: worth retrying
    in_failed_node = choose_spare(s, JOB, None, {}, frozenset({("node", "n1")}))
    assert in_failed_node.unit is None and not in_failed_node.storage_blocked


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


# --- several ranks at once: failure domains, one distinct healthy spare each --------------


def node_b_lost_pool() -> PoolState:
    """Ranks 0-1 on node a, 2-3 on node b (rack r1); spares on a, b, and c (rack r2)."""
    events = [unit_event(f"u{r}", UnitState.BOUND, rank=r, epoch=1, pid=10 + r,
                         node="a" if r < 2 else "b", labels={"rack": "r1"}) for r in range(4)]
    events += [unit_event("spare-a", UnitState.SPARE, node="a", labels={"rack": "r1"}),
               unit_event("spare-b", UnitState.SPARE, node="b", labels={"rack": "r1"}),
               unit_event("spare-c", UnitState.SPARE, node="c", labels={"rack": "r2"})]
    return rebuild(events)


def test_failed_domains_are_where_nothing_of_the_job_survived() -> None:
    s = node_b_lost_pool()
    b = s.bound(JOB)
    assert failed_domains(s, [b[2], b[3]], [b[0], b[1]]) == {("node", "b")}
    assert failed_domains(s, [b[2]], [b[0], b[1], b[3]]) == frozenset()  # one alone: no
    assert failed_domains(s, [b[1], b[2]], [b[0], b[3]]) == frozenset()  # both nodes live on
    # every rank lost: the smallest domain holding them all (the rack), not each node only
    assert failed_domains(s, list(b.values()), []) == {("node", "a"), ("node", "b"),
                                                       ("rack", "r1")}
    # the reservation label and a GPU index are no failure domains
    assert domains(b[0]) == {("node", "a"), ("rack", "r1")}


def test_choose_spares_gives_each_failed_rank_a_distinct_healthy_spare_or_none() -> None:
    s = node_b_lost_pool()
    b = s.bound(JOB)
    avoid = frozenset({("node", "b")})
    plan = choose_spares(s, JOB, {2: b[2], 3: b[3]}, {}, avoid)
    assert plan.missing is None
    moved = {r: c.unit.name for r, c in plan.moves.items() if c.unit is not None}
    assert moved == {2: "spare-a", 3: "spare-c"}  # spare-b is nearest, but on the lost node
    assert "same rack" in plan.moves[2].reason and "another domain" in plan.moves[3].reason
    plan = choose_spares(s, JOB, {2: b[2], 3: b[3]}, {"spare-c": "no /ckpt"}, avoid)
    assert plan.moves == {} and plan.missing is not None  # all or nothing: never half moved
    assert "2 ranks [2, 3]" in plan.missing and "spare-c: no /ckpt" in plan.missing
    one = choose_spare(s, JOB, b[2], {"spare-a": "x", "spare-c": "y"}, avoid)
    assert one.unit is None and "spare-b: in the failed domain node=b" in one.reason
    assert "spare-a: x" in one.reason


@given(st.lists(st.sampled_from(["a", "b", "c"]), max_size=6),
       st.sets(st.sampled_from(["a", "b", "c"])), st.integers(1, 4),
       st.sets(st.integers(0, 5)))
@settings(max_examples=300, deadline=None)
def test_a_spare_plan_is_complete_distinct_and_healthy_or_empty(
        spare_nodes: list[str], down: set[str], need: int, unreachable: set[int]) -> None:
    s = rebuild([unit_event(f"u{r}", UnitState.BOUND, rank=r, epoch=1, pid=r + 1, node="a")
                 for r in range(need)]
                + [unit_event(f"s{i}", UnitState.SPARE, node=n)
                   for i, n in enumerate(spare_nodes)])
    avoid = frozenset(("node", n) for n in down)
    bad = {f"s{i}": "unreachable" for i in unreachable}
    b = s.bound(JOB)
    plan = choose_spares(s, JOB, {r: b[r] for r in range(need)}, bad, avoid)
    usable = [f"s{i}" for i, n in enumerate(spare_nodes) if n not in down
              and f"s{i}" not in bad]
    if len(usable) < need:
        assert plan.moves == {} and plan.missing
        outside = [n for n in spare_nodes if n not in down]
        # blocked by storage alone: a spare outside the failed domains, not given to an
        # earlier rank, could not reach it
        assert plan.storage_blocked == (len(outside) > len(usable))
        return
    assert not plan.storage_blocked
    assert plan.missing is None and sorted(plan.moves) == list(range(need))
    names = [c.unit.name for c in plan.moves.values() if c.unit is not None]
    assert len(set(names)) == need and set(names) <= set(usable)
