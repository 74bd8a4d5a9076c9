"""Events -> marks, one small function per track. Pure: the same events give the same marks."""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Sequence

from trainguard.events.envelope import Event
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    IncidentTransition,
    Injection,
    NodeHealth,
    NodeHealthKind,
    NodeTelemetry,
    PoolUnit,
    ProcessExit,
    ReplicaRefused,
    StepReport,
    UnitState,
)
from trainguard.incidents.model import Incident, order_key
from trainguard.timeline.model import Mark

GAP_FACTOR = 5.0  # a silence this many median step intervals long splits a rank's span
MIN_GAP_US = 1_000_000
RTT_FACTOR = 3.0  # an RTT sample this many times its path's median is marked
IDLE_UTIL_PCT = 10.0


def task_marks(events: Sequence[Event]) -> list[Mark]:
    out: list[Mark] = []
    runs: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for e in events:
        p = e.payload
        if isinstance(p, StepReport):
            runs[(p.rank, p.binding_epoch)].append(e)
        elif isinstance(p, CheckpointEvent):
            level = {CheckpointAction.CORRUPT: "bad", CheckpointAction.LOADED: "good"}.get(
                p.action, "info")
            out.append(Mark("task", "checkpoints", e.event_time,
                            f"checkpoint {p.action.value} step {p.step}",
                            detail=f"{p.path}, samples {p.samples_consumed}"
                            + (f", {p.reason}" if p.reason else ""),
                            event_id=e.event_id, level=level))
        elif isinstance(p, ProcessExit):
            out.append(Mark("task", f"rank {p.rank}", e.event_time,
                            f"rank {p.rank} pid {p.pid} exited ({p.ended})",
                            detail=f"node {e.subject.node}, seen via {p.detected_by}",
                            event_id=e.event_id, level="bad"))
    for (rank, epoch), evs in sorted(runs.items()):
        out += _step_spans(rank, epoch, evs)
    return out


def _step_spans(rank: int, epoch: int, evs: list[Event]) -> list[Mark]:
    evs = sorted(evs, key=order_key)
    times = [e.event_time for e in evs]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    limit = max(statistics.median(gaps) * GAP_FACTOR if gaps else 0.0, MIN_GAP_US)
    spans: list[list[Event]] = [[evs[0]]]
    for prev, cur in itertools.pairwise(evs):
        if cur.event_time - prev.event_time > limit:
            spans.append([])
        spans[-1].append(cur)
    out: list[Mark] = []
    for span in spans:
        a, b = span[0].payload, span[-1].payload
        assert isinstance(a, StepReport) and isinstance(b, StepReport)
        out.append(Mark("task", f"rank {rank}", span[0].event_time,
                        f"rank {rank} epoch {epoch}: steps {a.step}-{b.step}",
                        end=span[-1].event_time,
                        detail=f"samples {a.samples_consumed}-{b.samples_consumed}, pid {a.pid}, "
                        f"node {span[0].subject.node}",
                        event_id=span[0].event_id, level="good" if epoch else "info"))
    return out


def network_marks(events: Sequence[Event]) -> list[Mark]:
    out: list[Mark] = []
    rtts: dict[tuple[str, str], list[tuple[int, float, str]]] = defaultdict(list)
    errors: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
    carrier: dict[tuple[str, str], list[tuple[int, bool, str]]] = defaultdict(list)
    for e in events:
        p = e.payload
        node = e.subject.node or "?"
        if isinstance(p, NodeHealth) and p.kind in (NodeHealthKind.LINK_DOWN,
                                                    NodeHealthKind.LINK_UP):
            down = p.kind is NodeHealthKind.LINK_DOWN
            out.append(Mark("network", f"{node} {p.device or 'link'}", e.event_time,
                            f"{p.device or 'link'} {'down' if down else 'up'} on {node}",
                            detail=p.message, event_id=e.event_id,
                            level="bad" if down else "good"))
        elif isinstance(p, NodeTelemetry):
            for path in p.paths:
                if path.rtt_ms is not None:
                    rtts[(node, path.peer)].append((e.event_time, path.rtt_ms, e.event_id))
            for nic in p.nics:
                errs = (nic.rx_errors or 0) + (nic.tx_errors or 0) + (nic.rx_dropped or 0) \
                    + (nic.tx_dropped or 0)
                errors[(node, nic.name)].append((e.event_time, errs, e.event_id))
                down = nic.carrier is False or (nic.operstate or "up") == "down"
                carrier[(node, nic.name)].append((e.event_time, down, e.event_id))
    for (node, nic_name), states in sorted(carrier.items()):
        out += _no_carrier_marks(node, nic_name, states)
    for (node, peer), samples in sorted(rtts.items()):
        out += _rtt_marks(node, peer, samples)
    for (node, nic_name), counts in sorted(errors.items()):
        for (_, before, _), (t, now, eid) in itertools.pairwise(counts):
            if now > before:
                out.append(Mark("network", f"{node} {nic_name}", t,
                                f"{nic_name} on {node}: +{now - before} errors/drops",
                                event_id=eid, level="warn"))
    return out


def _no_carrier_marks(node: str, nic: str, states: list[tuple[int, bool, str]]) -> list[Mark]:
    """One mark per run of samples without carrier (a NIC down for an hour is one span)."""
    out: list[Mark] = []
    for down, run in itertools.groupby(states, key=lambda s: s[1]):
        if down:
            samples = list(run)
            out.append(Mark("network", f"{node} {nic}", samples[0][0],
                            f"{nic} on {node}: no carrier", end=samples[-1][0],
                            event_id=samples[0][2], level="bad"))
    return out


def _rtt_marks(node: str, peer: str, samples: list[tuple[int, float, str]]) -> list[Mark]:
    lane = f"{node}->{peer} RTT"
    med = statistics.median(s[1] for s in samples)
    out = [Mark("network", lane, samples[0][0],
                f"{node}->{peer} RTT median {med:.2f} ms, max {max(s[1] for s in samples):.2f} ms",
                end=samples[-1][0], event_id=samples[0][2])]
    high = [s for s in samples if med > 0 and s[1] > RTT_FACTOR * med]
    for t, rtt, eid in high:
        out.append(Mark("network", lane, t, f"RTT {rtt:.2f} ms ({rtt / med:.1f}x median)",
                        event_id=eid, level="warn"))
    return out


def gpu_marks(events: Sequence[Event]) -> list[Mark]:
    out: list[Mark] = []
    idle: dict[tuple[str, int], list[tuple[int, bool, str]]] = defaultdict(list)
    for e in events:
        p = e.payload
        node = e.subject.node or "?"
        if isinstance(p, NodeHealth) and p.kind in (NodeHealthKind.XID, NodeHealthKind.PCIE_AER):
            lane = f"{node} gpu {e.subject.gpu}" if e.subject.gpu is not None else f"{node} gpus"
            out.append(Mark("gpu", lane, e.event_time, f"{p.kind.value} {p.code} on {node}",
                            detail=p.message, event_id=e.event_id, level="bad"))
        elif isinstance(p, NodeTelemetry):
            for g in p.gpus:
                lane = f"{node} gpu {g.index}"
                if g.xids:
                    out.append(Mark("gpu", lane, e.event_time, f"XID {g.xids} on {lane}",
                                    event_id=e.event_id, level="bad"))
                if (g.ecc_dbe_volatile or 0) > 0 or g.remapped_rows_failure:
                    out.append(Mark("gpu", lane, e.event_time, f"ECC errors on {lane}",
                                    event_id=e.event_id, level="bad"))
                if g.throttle_reasons:
                    out.append(Mark("gpu", lane, e.event_time,
                                    f"throttled ({', '.join(g.throttle_reasons)})",
                                    event_id=e.event_id, level="warn"))
                if g.sm_util_pct is not None:
                    idle[(node, g.index)].append((e.event_time, g.sm_util_pct < IDLE_UTIL_PCT,
                                                  e.event_id))
    for (node, index), samples in sorted(idle.items()):
        out += _idle_spans(node, index, samples)
    return out


def _idle_spans(node: str, index: int, samples: list[tuple[int, bool, str]]) -> list[Mark]:
    """Spans where a GPU that was busy went idle (below 10% SM)."""
    out: list[Mark] = []
    busy_seen = False
    start: tuple[int, str] | None = None
    last = samples[0][0]
    for t, is_idle, eid in samples:
        if is_idle and busy_seen and start is None:
            start = (t, eid)
        if not is_idle:
            if start is not None:
                out.append(Mark("gpu", f"{node} gpu {index}", start[0],
                                f"{node} gpu {index} idle (SM < {IDLE_UTIL_PCT:.0f}%)",
                                end=t, event_id=start[1], level="warn"))
                start = None
            busy_seen = True
        last = t
    if start is not None:
        out.append(Mark("gpu", f"{node} gpu {index}", start[0],
                        f"{node} gpu {index} idle (SM < {IDLE_UTIL_PCT:.0f}%)", end=last,
                        event_id=start[1], level="warn"))
    return out


def resource_marks(events: Sequence[Event]) -> list[Mark]:
    out: list[Mark] = []
    for e in events:
        p = e.payload
        if isinstance(p, PoolUnit):
            level = {UnitState.BOUND: "good", UnitState.FENCED: "warn",
                     UnitState.FAILED: "bad"}.get(p.state, "info")
            what = f"unit {p.unit} {p.state.value}"
            if p.rank is not None:
                what += f" (rank {p.rank}, epoch {p.epoch}, pid {p.pid})"
            detail = f"released {', '.join(p.released)}" if p.released else p.reason
            out.append(Mark("resources", p.unit, e.event_time, what, detail=detail,
                            event_id=e.event_id, level=level))
        elif isinstance(p, ReplicaRefused):
            out.append(Mark("resources", f"rank {p.rank} replicas", e.event_time,
                            f"stale replica of rank {p.rank} (epoch {p.stale_epoch} < "
                            f"{p.current_epoch}) {p.action}", detail=p.reason,
                            event_id=e.event_id, level="warn"))
    return out


def action_marks(inc: Incident, events: Sequence[Event]) -> list[Mark]:
    out: list[Mark] = []
    for c in sorted(inc.commands.values(), key=lambda c: (c.issued_time, c.command_id)):
        final = c.final
        status = final.status.value if final else "pending"
        dur = f" in {(final.time - c.issued_time) / 1e6:.2f} s" if final else ""
        out.append(Mark("actions", f"tier {c.tier}", c.issued_time,
                        f"tier {c.tier} {c.action.value}: {status}{dur}",
                        end=final.time if final else None,
                        detail=", ".join(f"{k}={v}" for k, v in sorted(
                            c.params.model_dump(mode="json", exclude_none=True).items()))
                        + (f"; {final.detail}" if final and final.detail else ""),
                        event_id=c.event_id,
                        level="good" if status == "done" else "bad" if final else "warn"))
    starts: dict[str, Event] = {}
    for e in events:
        p = e.payload
        if not isinstance(p, Injection):
            continue
        if p.phase == "start":
            starts[p.drill_id + p.fault] = e
            continue
        begin = starts.pop(p.drill_id + p.fault, None)
        out.append(Mark("actions", "drills", begin.event_time if begin else e.event_time,
                        f"drill {p.fault} on {p.target} ({p.scenario})", end=e.event_time,
                        detail=f"{p.phase}", event_id=e.event_id, level="bad"))
    for e in starts.values():
        p = e.payload
        assert isinstance(p, Injection)
        out.append(Mark("actions", "drills", e.event_time,
                        f"drill {p.fault} on {p.target} ({p.scenario})", detail="start",
                        event_id=e.event_id, level="bad"))
    return out


def detection_marks(inc: Incident) -> list[Mark]:
    out: list[Mark] = []
    for v in sorted(inc.verdicts.values(), key=lambda v: (v.opened_time, v.verdict_id)):
        who = ", ".join(f"{k} {x}" for k, x in v.subject.model_dump(exclude_none=True).items())
        out.append(Mark("detection", "verdicts", v.opened_time,
                        f"{v.severity.value} {v.kind} at {who or 'the job'}",
                        end=v.resolved_time,
                        detail=", ".join(f"{k}={x}" for k, x in sorted(v.evidence.items())),
                        event_id=v.open_event_id,
                        level="bad" if v.severity.value == "critical" else "warn"))
    for t in inc.transitions:
        p = t.payload
        assert isinstance(p, IncidentTransition)
        tier = f" (tier {p.tier})" if p.tier is not None and p.to_state == "mitigating" else ""
        out.append(Mark("detection", "incident", t.event_time, f"-> {p.to_state.value}{tier}",
                        detail=p.reason, event_id=t.event_id,
                        level="good" if p.to_state == "recovered" else "info"))
    return out
