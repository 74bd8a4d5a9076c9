"""The same log gives a byte-identical verdict sequence whatever the arrival interleaving
within the lateness bound, with duplicated records, and across snapshot/restore."""

from __future__ import annotations

import random

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.rules_support import T0, S
from trainguard.events.codec import encode
from trainguard.events.envelope import Event
from trainguard.events.payloads import CheckpointAction, NodeHealthKind, StepReport, Verdict
from trainguard.events.registry import URGENT_TYPES
from trainguard.rules import RuleEngine, RuleSet, parse_rules
from trainguard.rules.engine import LANE_IDLE_US, LANE_OF
from trainguard.rules.liveness import LivenessRule
from trainguard.rules.params import KINDS
from trainguard.rules.registry import EVALUATORS
from trainguard.rules.straggler import StragglerRule
from trainguard.rules.synth import (
    bound,
    checkpoint,
    gpu,
    job_steps,
    node_health,
    process_exit,
    step_report,
    telemetry,
)

pytestmark = pytest.mark.unit
RULES: RuleSet = parse_rules(
    "allowed_lateness_ms: 2000\nrules:\n"
    + "".join(f"  - id: {k.replace('_', '-')}\n    kind: {k}\n" for k in KINDS if k != "liveness")
    + "  - id: liveness\n    kind: liveness\n    parameters: {floor_ms: 3000}\n",
    "determinism.yaml")


def scenario() -> list[Event]:
    """~30 s of an 8-rank job with a straggler that comes and goes, a NaN, an XID, a link
    flap, a hot GPU, a crashed rank and a silent one."""
    ev: list[Event] = []
    for e in job_steps("j", 8, 150, noise=0.05, seed=7, slow={3: (40, 1.7)}):
        rep = e.payload
        assert isinstance(rep, StepReport)
        if rep.rank == 3 and rep.step >= 90:  # the straggler recovers
            e = step_report("j", 3, rep.step, e.event_time, 100.0)
        if rep.rank == 6 and rep.step > 100:  # goes silent
            continue
        if rep.rank == 0:
            loss = float("nan") if rep.step == 120 else 2.0
            e = step_report("j", 0, rep.step, e.event_time, rep.compute_ms, loss=loss)
        ev.append(e)
    for i in range(30):
        for n in range(2):
            hot = n == 1 and 5 <= i < 15
            gpus = [gpu(g, temp=85.0 if hot and g == 2 else 60.0 + g % 2, util=95.0)
                    for g in range(8)]
            ev.append(telemetry("j", f"n{n}", T0 + i * S + 500 + n, i, gpus))
    ev.append(node_health("j", "n0", NodeHealthKind.XID, T0 + 12 * S, code=79, gpu=1))
    ev.append(node_health("j", "n1", NodeHealthKind.LINK_DOWN, T0 + 14 * S, device="ib0"))
    ev.append(node_health("j", "n1", NodeHealthKind.LINK_UP, T0 + 15 * S, device="ib0"))
    ev.append(checkpoint("j", CheckpointAction.WRITTEN, 100, T0 + 20 * S + 7))
    ev.append(process_exit("j", "node-0", 7, T0 + 27 * S, exit_code=1))
    return ev


LOG = scenario()
IN_ORDER = sorted(LOG, key=lambda e: (e.event_time, e.event_id))


def run(arrivals: list[Event], cut: int | None = None) -> list[bytes]:
    engine = RuleEngine("j", RULES)
    out: list[Event] = []
    for i, e in enumerate(arrivals):
        if cut is not None and i == cut:  # a restart: state through JSON into a new engine
            saved = orjson.loads(orjson.dumps(engine.snapshot()))
            engine = RuleEngine("j", RULES, saved)
        out.extend(engine.feed(e))
    out.extend(engine.flush())
    assert engine.stats()["late"] == 0
    return [encode(v) for v in out]


REFERENCE = run(IN_ORDER)


def test_scenario_produces_every_kind_of_lifecycle() -> None:
    kinds = set()
    engine = RuleEngine("j", RULES)
    for e in IN_ORDER:
        for v in engine.feed(e):
            assert isinstance(v.payload, Verdict)
            kinds.add((v.payload.kind, v.payload.state.value))
    for v in engine.flush():
        assert isinstance(v.payload, Verdict)
        kinds.add((v.payload.kind, v.payload.state.value))
    assert {("straggler", "open"), ("straggler", "resolved"), ("loss_nonfinite", "open"),
            ("xid_drain", "open"), ("link_down", "resolved"), ("hw_outlier", "resolved"),
            ("rank_silent", "open"), ("process_exit", "open")} <= kinds


def shuffled(seed: int, dup_share: float) -> list[Event]:
    """Arrival order: each record delayed by a jitter in [0, lateness); some duplicated."""
    rng = random.Random(seed)
    lateness = RULES.allowed_lateness_us
    keyed = []
    for i, e in enumerate(LOG):
        keyed.append((e.event_time + rng.randrange(lateness), i, e))
        if rng.random() < dup_share:
            keyed.append((e.event_time + rng.randrange(lateness), i, e))
    keyed.sort(key=lambda x: (x[0], x[1]))
    return [e for _, _, e in keyed]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), dup_share=st.sampled_from([0.0, 0.1, 0.5]),
       cut=st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_same_log_same_bytes(seed: int, dup_share: float, cut: float | None) -> None:
    arrivals = shuffled(seed, dup_share)
    at = None if cut is None else int(cut * len(arrivals))
    assert run(arrivals, at) == REFERENCE


def test_replaying_the_verdicts_twice_dedupes_by_id() -> None:
    ids = [orjson.loads(b)["event_id"] for b in REFERENCE]
    assert len(ids) == len(set(ids))
    assert run(IN_ORDER) == REFERENCE


def test_snapshot_is_plain_json_and_rule_change_resets_only_that_rule() -> None:
    engine = RuleEngine("j", RULES)
    for e in IN_ORDER[: len(IN_ORDER) // 2]:
        engine.feed(e)
    snap = engine.snapshot()
    assert orjson.loads(orjson.dumps(snap)) == snap
    text = ("allowed_lateness_ms: 2000\nrules:\n  - id: straggler\n    kind: straggler\n"
            "    parameters: {k: 2}\n  - id: liveness\n    kind: liveness\n"
            "    parameters: {floor_ms: 3000}\n")
    other = RuleEngine("j", parse_rules(text), snap)
    states = dict(other.rules)
    straggler = states["straggler"]
    assert isinstance(straggler, StragglerRule) and straggler.ranks == {}  # changed: fresh
    liveness = states["liveness"]
    assert isinstance(liveness, LivenessRule) and liveness.st.seen  # unchanged: restored


def late_arrivals(seed: int) -> list[Event]:
    """Some records held back well beyond the lateness bound: they must be dropped."""
    rng = random.Random(seed)
    keyed = []
    for i, e in enumerate(LOG):
        delay = rng.randrange(RULES.allowed_lateness_us)
        if rng.random() < 0.05:
            delay += 5 * RULES.allowed_lateness_us
        keyed.append((e.event_time + delay, i, e))
    keyed.sort(key=lambda x: (x[0], x[1]))
    return [e for _, _, e in keyed]


@settings(max_examples=6, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), cut=st.floats(0.0, 1.0))
def test_late_records_are_counted_and_dropped_deterministically(seed: int, cut: float) -> None:
    arrivals = late_arrivals(seed)

    def go(at: int | None) -> tuple[list[bytes], int]:
        engine = RuleEngine("j", RULES)
        out: list[Event] = []
        for i, e in enumerate(arrivals):
            if i == at:
                engine = RuleEngine("j", RULES, orjson.loads(orjson.dumps(engine.snapshot())))
            out.extend(engine.feed(e))
        out.extend(engine.flush())
        return [encode(v) for v in out], engine.stats()["late"]

    first, late = go(None)
    assert late > 0
    assert go(int(cut * len(arrivals))) == (first, late)


def test_engine_factory_serves_the_streams_app() -> None:
    from trainguard.rules import engine_factory
    from trainguard.streams.engine import EngineFactory

    factory: EngineFactory = engine_factory(RULES)
    engine = factory("j", None)
    half = len(IN_ORDER) // 2
    out = [v for e in IN_ORDER[:half] for v in engine.feed(e)]
    saved = orjson.loads(orjson.dumps(engine.snapshot()))
    resumed = factory("j", saved)
    out += [v for e in IN_ORDER[half:] for v in resumed.feed(e)]
    assert isinstance(resumed, RuleEngine)
    out += resumed.flush()
    assert [encode(v) for v in out] == REFERENCE
    assert factory("other", None).feed(IN_ORDER[0]) == []  # another job's event is ignored


# --- the prompt lane: discrete critical signals decided on arrival ---------------------------

PROMPT_KINDS = {"process_exit", "xid_drain", "link_down"}


def run_prompt(arrivals: list[Event], cut: int | None = None) -> list[bytes]:
    engine = RuleEngine("j", RULES, prompt=True)
    out: list[Event] = []
    for i, e in enumerate(arrivals):
        if cut is not None and i == cut:
            engine = RuleEngine("j", RULES, orjson.loads(orjson.dumps(engine.snapshot())),
                                prompt=True)
        out.extend(engine.feed(e))
    out.extend(engine.flush())
    assert engine.stats()["early_pending"] == 0 and engine.stats()["retracted"] == 0
    return [encode(v) for v in out]


def _is_early(raw: bytes) -> bool:
    doc = orjson.loads(raw)
    return bool(doc["payload"]["kind"] in PROMPT_KINDS and doc["payload"]["state"] == "open")


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), dup_share=st.sampled_from([0.0, 0.1, 0.5]),
       cut=st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_prompt_lane_moves_the_same_bytes_earlier(seed: int, dup_share: float,
                                                  cut: float | None) -> None:
    arrivals = shuffled(seed, dup_share)
    at = None if cut is None else int(cut * len(arrivals))
    got = run_prompt(arrivals, at)
    assert got == run_prompt(arrivals)  # a restart anywhere changes nothing
    assert sorted(got) == sorted(REFERENCE)  # the same verdicts, byte for byte, once each
    assert [b for b in got if not _is_early(b)] == [b for b in REFERENCE if not _is_early(b)]
    assert sum(map(_is_early, got)) == 3  # the exit, the XID 79 and the link down
    for b in got:  # each early verdict comes no later than in the ordered sequence
        if _is_early(b):
            assert got.index(b) <= REFERENCE.index(b)


def test_prompt_lane_answers_the_exit_in_the_same_call() -> None:
    steps = list(job_steps("j", 4, 20))
    t_exit = steps[-1].event_time + 1
    exit_ev = process_exit("j", "node-0", 3, t_exit, signal=9)
    for prompt in (False, True):
        engine = RuleEngine("j", RULES, prompt=prompt)
        for e in steps:
            engine.feed(e)
        got = engine.feed(exit_ev)
        if prompt:
            assert [(v.payload.kind, v.subject.rank) for v in got  # type: ignore[attr-defined]
                    ] == [("process_exit", 3)]
            assert engine.flush() == []  # confirmed by the ordered evaluation: not repeated
        else:
            assert got == []  # waits for the watermark
            assert [v.payload.kind for v in engine.flush()] == [  # type: ignore[attr-defined]
                "process_exit"]


def test_prompt_lane_retracts_an_exit_a_newer_replica_makes_stale() -> None:
    """The old replica's exit arrives before the new replica's binding (the actuator's
    verified ``pool.unit``), which has an earlier event time (clock skew between the two
    nodes): opened early, then retracted."""
    steps = list(job_steps("j", 4, 20))
    t = steps[-1].event_time
    ghost_exit = process_exit("j", "node-0", 2, t + 500_000, signal=9, epoch=0)
    new_binding = bound("j", 2, 1, t + 400_000, pid=4002)
    new_report = step_report("j", 2, 20, t + 450_000, 100.0, world=4, epoch=1, pid=4002)
    engine = RuleEngine("j", RULES, prompt=True)
    out: list[Event] = []
    for e in [*steps, ghost_exit, new_binding, new_report]:
        out.extend(engine.feed(e))
    out.extend(engine.flush())
    states = [(v.payload.kind, v.payload.state.value, v.payload.evidence.get("retracted"))
              for v in out if isinstance(v.payload, Verdict)]
    assert states == [("process_exit", "open", None), ("process_exit", "resolved", True)]
    assert engine.stats()["retracted"] == 1 and engine.stats()["stale"] == 1
    # in event-time order: nothing at all
    assert [v for v in run([*steps, new_binding, new_report, ghost_exit])] == []


@pytest.mark.parametrize("telemetry_first", [True, False])
def test_a_worker_behind_a_backlog_reads_one_topic_ahead_of_the_other_and_decides_the_same(
        telemetry_first: bool) -> None:
    """A streams worker that starts behind the log reads the task and telemetry topics in
    turns, and one runs ahead of the other (the sparse telemetry, seconds ahead of the dense
    task topic): here 6 s, within LANE_IDLE_US. Each lane holds the watermark, so nothing is
    late and the bytes are the same."""
    by_lane: dict[str | None, list[Event]] = {}
    for e in IN_ORDER:
        by_lane.setdefault(LANE_OF.get(e.type), []).append(e)
    assert set(by_lane) == {"task", "telemetry"}
    ahead, behind = by_lane["telemetry"], by_lane["task"]
    if not telemetry_first:
        ahead, behind = behind, ahead
    lead = 6 * S
    assert lead + RULES.allowed_lateness_us < LANE_IDLE_US
    arrivals: list[Event] = [behind[0]]  # the first turn reads a record of each topic
    i = 0
    for e in behind[1:]:
        while i < len(ahead) and ahead[i].event_time <= e.event_time + lead:
            arrivals.append(ahead[i])
            i += 1
        arrivals.append(e)
    arrivals += ahead[i:]
    assert run(arrivals) == REFERENCE


# --- the urgent lane: copies of the urgent events, read apart from the backlog -------------

def with_copies(seed: int, dup_share: float) -> list[tuple[bool, Event]]:
    """The shuffled arrivals of ``shuffled``, plus the urgent copy of every urgent event at a
    random place: mostly ahead of its original by any length of backlog (the urgent topic
    overtakes the task and telemetry partitions), sometimes after it. (copy?, event)."""
    rng = random.Random(seed ^ 0x5EED)
    arrivals: list[tuple[bool, Event]] = [(False, e) for e in shuffled(seed, dup_share)]
    for e in [e for e in LOG if e.type in URGENT_TYPES]:
        own = next(i for i, (_, a) in enumerate(arrivals) if a is e)
        at = rng.randrange(own + 1) if rng.random() < 0.8 else rng.randrange(own, len(arrivals))
        arrivals.insert(at, (True, e))
    return arrivals


def run_urgent(arrivals: list[tuple[bool, Event]], cut: int | None = None
               ) -> tuple[list[bytes], dict[str, int]]:
    """Feed originals in order and copies to ``early``, as the two agents of the streams
    worker do; return the bytes and, per early verdict, the arrival index that emitted it."""
    engine = RuleEngine("j", RULES, prompt=True)
    out: list[bytes] = []
    emitted_at: dict[str, int] = {}
    for i, (copy, e) in enumerate(arrivals):
        if cut is not None and i == cut:
            engine = RuleEngine("j", RULES, orjson.loads(orjson.dumps(engine.snapshot())),
                                prompt=True)
        got = engine.early(e) if copy else engine.feed(e)
        for v in got:
            emitted_at.setdefault(v.event_id, i)
        out += [encode(v) for v in got]
    out += [encode(v) for v in engine.flush()]
    assert engine.stats()["early_pending"] == 0 and engine.stats()["retracted"] == 0
    assert engine.stats()["late"] == 0
    return out, emitted_at


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), dup_share=st.sampled_from([0.0, 0.1]),
       cut=st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_urgent_copies_overtaking_any_backlog_move_the_same_bytes_earlier(
        seed: int, dup_share: float, cut: float | None) -> None:
    arrivals = with_copies(seed, dup_share)
    at = None if cut is None else int(cut * len(arrivals))
    got, emitted_at = run_urgent(arrivals, at)
    assert got == run_urgent(arrivals)[0]  # a restart anywhere changes nothing
    assert sorted(got) == sorted(REFERENCE)  # the same verdicts, byte for byte, once each
    assert [b for b in got if not _is_early(b)] == [b for b in REFERENCE if not _is_early(b)]
    for b in got:  # an early verdict comes with its copy, or with its original if that is first
        if _is_early(b):
            doc = orjson.loads(b)  # decided at its source's event time; those differ here
            source = next(i for i, (_, e) in enumerate(arrivals)
                          if e.type in URGENT_TYPES and e.event_time == doc["event_time"])
            assert emitted_at[doc["event_id"]] == source


def test_an_urgent_copy_after_its_original_adds_nothing() -> None:
    steps = list(job_steps("j", 4, 20))
    exit_ev = process_exit("j", "node-0", 3, steps[-1].event_time + 1, signal=9)
    engine = RuleEngine("j", RULES, prompt=True)
    for e in steps:
        engine.feed(e)
    assert [v.payload.kind for v in engine.feed(exit_ev)] == [  # type: ignore[attr-defined]
        "process_exit"]
    assert engine.early(exit_ev) == []  # buffered: its verdict is out already
    assert engine.flush() == [] and engine.early(exit_ev) == []  # evaluated
    assert RuleEngine("j", RULES).early(exit_ev) == []  # no prompt lane, no early verdicts
    assert RuleEngine("other", RULES, prompt=True).early(exit_ev) == []  # another job's


def test_every_type_a_rule_answers_promptly_has_an_urgent_copy() -> None:
    prompt_types = {t for cls in EVALUATORS.values() for t in cls.prompt_types}
    assert prompt_types and prompt_types <= URGENT_TYPES


def test_an_urgent_copy_whose_original_never_comes_is_retracted_once_the_watermark_passes(
        ) -> None:
    """A copy alone (its original lost, late, or forged onto the urgent topic by itself):
    decided at once, then retracted when the job's watermark passes its time, since the
    ordered evaluation will never confirm it."""
    steps = list(job_steps("j", 4, 40))
    mid = steps[len(steps) // 2].event_time
    lone = process_exit("j", "node-0", 2, mid + 1, signal=9)
    engine = RuleEngine("j", RULES, prompt=True)
    out: list[Event] = []
    for e in steps[: len(steps) // 2]:
        out += engine.feed(e)
    early = engine.early(lone)
    assert [(v.payload.kind, v.payload.state.value) for v in early  # type: ignore[attr-defined]
            ] == [("process_exit", "open")]
    later = []
    for e in steps[len(steps) // 2:]:
        later += engine.feed(e)
    retracted = [v for v in later if isinstance(v.payload, Verdict)
                 and v.payload.evidence.get("retracted")]
    assert [(v.payload.kind, v.payload.state.value, v.payload.evidence["reason"])  # type: ignore[attr-defined]
            for v in retracted] == [("process_exit", "resolved",
                                      "its event never came in event-time order")]
    assert engine.stats()["retracted"] == 1 and engine.stats()["early_pending"] == 0
    # at the end of a replay too
    alone = RuleEngine("j", RULES, prompt=True)
    assert len(alone.early(lone)) == 1
    assert [v.payload.state.value for v in alone.flush()] == ["resolved"]  # type: ignore[attr-defined]
