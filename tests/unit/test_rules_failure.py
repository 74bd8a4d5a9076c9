"""Failure rules: silence, process exit, XID classes, links, throttling, ECC."""

from __future__ import annotations

import pytest

from tests.unit.rules_support import RULES, T0, S, kinds, run
from trainguard.events.payloads import (
    DepartureCause,
    ExitEvidence,
    NicSample,
    NodeHealthKind,
    Verdict,
)
from trainguard.rules import RuleEngine
from trainguard.rules.synth import (
    gpu,
    heartbeat,
    job_steps,
    node_health,
    process_exit,
    step_report,
    telemetry,
)

pytestmark = pytest.mark.unit


def test_silent_rank_against_watermark_and_back() -> None:
    # 4 ranks, 1 s steps; rank 2 stops at step 10; others go on to step 100
    events = [step_report("j", r, s, T0 + s * S + r, 1000.0, world=4)
              for s in range(100) for r in range(4) if not (r == 2 and 10 < s < 90)]
    out = run(events)
    assert kinds(out) == [("rank_silent", "open"), ("rank_silent", "resolved")]
    opened = out[0]
    assert opened.subject.rank == 2
    assert isinstance(opened.payload, Verdict)
    # timeout = max(10 x 1 s median step, 60 s floor) = 60 s after its last report (step 10)
    assert opened.payload.first_anomalous_time == T0 + 10 * S + 2
    assert 60 * S < opened.event_time - opened.payload.first_anomalous_time <= 62 * S


def test_heartbeats_keep_a_rank_alive() -> None:
    events = [step_report("j", r, s, T0 + s * S + r, 1000.0, world=4)
              for s in range(100) for r in range(4) if not (r == 2 and s > 10)]
    events += [heartbeat("j", 2, T0 + s * S + 500) for s in range(11, 100)]
    assert kinds(run(events)) == []


def test_process_exit_opens_and_the_new_process_resolves() -> None:
    events = [step_report("j", r, s, T0 + s * S + r, 1000.0, world=4)
              for s in range(20) for r in range(4)]
    events.append(process_exit("j", "node-0", 1, T0 + 20 * S, exit_code=137))
    events.append(process_exit("j", "node-0", 3, T0 + 20 * S, exit_code=0))  # clean: nothing
    events.append(step_report("j", 1, 21, T0 + 200 * S, 1000.0, world=4))
    k = kinds(run(events))
    assert ("process_exit", "open") in k and ("process_exit", "resolved") in k
    assert ("rank_silent", "open") in k  # rank 3 exited cleanly but the job did not end
    assert k.count(("process_exit", "open")) == 1


def test_an_exit_whose_status_nobody_read_is_a_fault() -> None:
    # under Slurm slurmstepd reaps the rank: its agent sees the pidfd close, no code, no signal.
    # Every rank of the job ends that way, so no watermark is left to find them silent
    events = [step_report("j", r, s, T0 + s * S + r, 1000.0, world=3)
              for s in range(20) for r in range(3)]
    events += [process_exit("j", f"node-{r}", r, T0 + 20 * S + i * 70_000, exit_code=None)
               for i, r in enumerate((1, 0, 2))]
    got = [(e.payload, e.subject.rank) for e in run(events) if isinstance(e.payload, Verdict)]
    assert [(v.kind, v.state.value, rank) for v, rank in got] == [
        ("process_exit", "open", 1), ("process_exit", "open", 0), ("process_exit", "open", 2)]
    assert got[0][0].evidence["exit_code"] is None
    assert got[0][0].evidence["signal"] is None


def test_an_unread_exit_is_read_by_what_the_rank_declared() -> None:
    # the same unread exits, each rank having said something before it ended: one that said
    # it completed with 0 is no fault; the others carry their declaration as evidence
    events = [step_report("j", r, s, T0 + s * S + r, 1000.0, world=3)
              for s in range(20) for r in range(3)]
    said = {0: (3, DepartureCause.PEER_LOST, "lost a peer at step 21"),
            1: (0, DepartureCause.COMPLETED, "done"), 2: (1, DepartureCause.ERROR, None)}
    events += [process_exit("j", f"node-{r}", r, T0 + 20 * S + r, exit_code=None, said=said[r])
               for r in said]
    got = {e.subject.rank: e.payload for e in run(events) if isinstance(e.payload, Verdict)}
    assert set(got) == {0, 2}
    ev0, ev2 = got[0].evidence, got[2].evidence
    assert (ev0["declared_code"], ev0["declared_cause"], ev0["declared_reason"]) == (
        3, "peer_lost", "lost a peer at step 21")
    assert (ev2["declared_code"], ev2["declared_cause"]) == (1, "error")
    assert "declared_reason" not in ev2 and ev2["exit_code"] is None
    exit_ev = ExitEvidence.of(ev0)
    assert (exit_ev.declared_code, exit_ev.declared_cause) == (3, DepartureCause.PEER_LOST)


def test_xid_classes() -> None:
    events = [node_health("j", "n1", NodeHealthKind.XID, T0 + 1, code=79, gpu=3),
              node_health("j", "n1", NodeHealthKind.XID, T0 + 2, code=79, gpu=3),  # repeat
              node_health("j", "n2", NodeHealthKind.XID, T0 + 3, code=13, gpu=0),
              telemetry("j", "n3", T0 + 4, 1, [gpu(5, xids=[48])]),
              node_health("j", "n2", NodeHealthKind.XID, T0 + 900 * S, code=999)]
    out = run(events)
    vs = [(v.payload.kind, v.payload.state.value, v.payload.severity.value, v.subject.node,
           v.subject.gpu) for v in out if isinstance(v.payload, Verdict)]
    assert vs == [("xid_drain", "open", "critical", "n1", 3),
                  ("xid_app", "open", "warning", None, None),
                  ("xid_drain", "open", "critical", "n3", 5),
                  ("xid_app", "resolved", "warning", None, None),  # quiet 10 min
                  ("xid_other", "open", "warning", "n2", None)]


def test_link_down_up_and_flapping() -> None:
    ev = [node_health("j", "n1", NodeHealthKind.LINK_DOWN, T0 + 1 * S, device="ib0"),
          node_health("j", "n1", NodeHealthKind.LINK_UP, T0 + 2 * S, device="ib0")]
    assert kinds(run(ev)) == [("link_down", "open"), ("link_down", "resolved")]
    nics = [(True, 0), (True, 0), (True, 2), (True, 3)] + [(True, 3)] * 5
    ev = [telemetry("j", "n1", T0 + i * 100 * S, i,
                    nics=[NicSample(name="mlx5_0", kind="infiniband", carrier=c,
                                    carrier_changes=cc)])
          for i, (c, cc) in enumerate(nics)]
    assert kinds(run(ev)) == [("link_flapping", "open"), ("link_flapping", "resolved")]
    # a port never seen up is unused, not down
    ev = [telemetry("j", "n1", T0 + i * S, i, nics=[NicSample(name="eth1", operstate="down")])
          for i in range(5)]
    assert kinds(run(ev)) == []


def test_thermal_throttle_sustained_then_clear() -> None:
    hot = [telemetry("j", "n1", T0 + i * S, i,
                     [gpu(0, temp=91.0, throttle_reasons=["hw_thermal_slowdown"])])
           for i in range(3)]
    cool = [telemetry("j", "n1", T0 + (3 + i) * S, 3 + i, [gpu(0)]) for i in range(3)]
    assert kinds(run(hot + cool)) == [("thermal_throttle", "open"),
                                      ("thermal_throttle", "resolved")]
    blip = [telemetry("j", "n1", T0 + S, 1, [gpu(0, temp=91.0)]),
            telemetry("j", "n1", T0 + 2 * S, 2, [gpu(0)])]
    assert kinds(run(blip)) == []
    capped = [telemetry("j", "n1", T0 + i * S, i, [gpu(0, throttle_reasons=["sw_power_cap"])])
              for i in range(5)]
    assert kinds(run(capped)) == []  # a power cap at full load is normal


def test_ecc() -> None:
    seq = [gpu(0, ecc_dbe_volatile=0, ecc_sbe_volatile=0, remapped_rows_pending=False),
           gpu(0, ecc_dbe_volatile=1, ecc_sbe_volatile=500, remapped_rows_pending=True),
           gpu(0, ecc_dbe_volatile=0, ecc_sbe_volatile=0, remapped_rows_pending=False)]
    ev = [telemetry("j", "n1", T0 + i * 120 * S, i, [g]) for i, g in enumerate(seq)]
    k = kinds(run(ev))
    assert k == [("ecc_dbe", "open"), ("row_remap_pending", "open"), ("ecc_sbe_rate", "open"),
                 ("ecc_dbe", "resolved"), ("row_remap_pending", "resolved")]


def test_late_events_are_counted_and_ignored() -> None:
    engine = RuleEngine("j", RULES)
    events = list(job_steps("j", 4, 30))
    for e in events:
        engine.feed(e)
    engine.feed(step_report("j", 0, 1, events[0].event_time, 1.0, world=4))  # 6 s late
    assert engine.stats()["late"] == 1


def test_half_a_declaration_is_none() -> None:
    # the agent sets code and cause together; evidence with one of them reads as no declaration
    for ev in ({"declared_cause": "peer_lost"}, {"declared_code": 3},
               {"declared_code": 3, "declared_cause": None}):
        got = ExitEvidence.of({"pid": 7, "exit_code": None, **ev})
        assert (got.pid, got.declared_code, got.declared_cause) == (7, None, None), ev
    assert "declared_cause" not in ExitEvidence(declared_code=3).as_evidence()
