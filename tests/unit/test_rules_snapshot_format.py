"""The rules' snapshot wire format is fixed: the bytes of every rule's ``snapshot()`` (through
``orjson.dumps``, what the streams app stores) at fixed points of fixed logs match digests
recorded from the code before its state was typed (issue 14), so a refactor of the rule state
keeps snapshots written by a running worker readable, and a restored engine decides the same.

A deliberate change of a rule's state layout updates the digests (``python -m
tests.unit.test_rules_snapshot_format --write``) and says so in its commit.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import orjson
import pytest

from tests.unit.rules_support import T0, S
from trainguard.events.envelope import Event
from trainguard.events.payloads import CheckpointAction, NodeHealthKind
from trainguard.quality.cases import all_cases, sorted_events
from trainguard.rules import RuleEngine, RuleSet, load_default_rules, parse_rules
from trainguard.rules.params import KINDS
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
GOLDEN = Path(__file__).parent / "snapshot_digests.json"
ALL_KINDS: RuleSet = parse_rules(
    "allowed_lateness_ms: 2000\nrules:\n"
    + "".join(f"  - id: {k.replace('_', '-')}\n    kind: {k}\n" for k in KINDS),
    "snapshot-format.yaml")
CASES = ("stage-2-late-1.6x", "throttle-bursts", "hetero-late-2.2x", "kmsg-oom-at-ranks",
         "fault-feed-overlap", "dcgm-8xH100", "stages-2-ranks", "alibaba-3")
CUTS = (0.2, 0.5, 0.8, 1.0)


def mixed_log() -> list[Event]:
    """Two stages, a straggler, a checkpoint resume (steps go back: the step groups restart),
    a new binding of a rank, an OOM kill, an XID, a link flap, a hot GPU and an exit."""
    ev: list[Event] = list(job_steps("j", 8, 90, noise=0.05, seed=3, slow={3: (30, 1.8)},
                                     stages=2, pids={r: 500 + r for r in range(8)}))
    # a resume from the checkpoint at step 60: steps 61.. again, 90 steps later in time
    ev.append(checkpoint("j", CheckpointAction.WRITTEN, 60, T0 + 60 * 200_000 + 5))
    restart = T0 + 95 * 200_000
    ev.append(checkpoint("j", CheckpointAction.LOADED, 60, restart - 7))
    ev.append(bound("j", 5, 1, restart - 3, pid=905))
    ev.extend(job_steps("j", 8, 60, noise=0.05, seed=4, stages=2, first_step=61,
                        start_us=restart, pids={r: 500 + r for r in range(8)} | {5: 905}))
    for i in range(30):
        for n in range(2):
            hot = n == 1 and 5 <= i < 15
            gpus = [gpu(g, temp=85.0 if hot and g == 2 else 60.0 + g % 2, util=95.0)
                    for g in range(8)]
            ev.append(telemetry("j", f"node-{n}", T0 + i * S + 500 + n, i, gpus))
    ev.append(node_health("j", "node-0", NodeHealthKind.XID, T0 + 12 * S, code=79, gpu=1))
    ev.append(node_health("j", "node-1", NodeHealthKind.LINK_DOWN, T0 + 14 * S, device="ib0"))
    ev.append(node_health("j", "node-1", NodeHealthKind.LINK_UP, T0 + 15 * S, device="ib0"))
    ev.append(node_health("j", "node-0", NodeHealthKind.OOM_KILL, T0 + 16 * S, code=502))
    ev.append(node_health("j", "node-0", NodeHealthKind.OOM_KILL, T0 + 17 * S, code=4242))
    ev.append(step_report("j", 0, 200, T0 + 40 * S, 100.0, loss=float("nan")))
    ev.append(process_exit("j", "node-0", 7, T0 + 27 * S, exit_code=1))
    return sorted(ev, key=lambda e: (e.event_time, e.event_id))


def logs() -> dict[str, tuple[list[Event], RuleSet]]:
    default = load_default_rules()
    out = {"mixed": (mixed_log(), ALL_KINDS)}
    for case in all_cases():
        if case.name in CASES:
            out[case.name] = (sorted_events(case), default)
    return out


def digests() -> dict[str, dict[str, str]]:
    """log name -> "cut/rule" -> sha256 of the rule's snapshot bytes ("cut/engine": the whole
    engine's, buffer and epochs included)."""
    out: dict[str, dict[str, str]] = {}
    for name, (events, rules) in sorted(logs().items()):
        job = events[0].job_id
        engine = RuleEngine(job, rules)
        marks = {max(int(len(events) * c) - 1, 0): c for c in CUTS}
        got: dict[str, str] = {}
        for i, e in enumerate(events):
            engine.feed(e)
            if i in marks:
                if marks[i] == 1.0:
                    engine.flush()
                snap = engine.snapshot()
                for rid, entry in snap["rules"].items():
                    got[f"{marks[i]}/{rid}"] = _sha(orjson.dumps(entry["state"]))
                got[f"{marks[i]}/engine"] = _sha(orjson.dumps(snap))
        out[name] = got
    return out


def _sha(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()[:16]


@pytest.mark.skipif(sys.version_info >= (3, 12), reason=(
    "the digests were recorded on Python 3.11: from 3.12 sum() of floats is compensated, so "
    "float state differs in its last bits (the format itself is checked by the round trip)"))
def test_every_rule_snapshot_keeps_its_bytes() -> None:
    want = json.loads(GOLDEN.read_text())
    got = digests()
    assert sorted(got) == sorted(want)
    changed = sorted(f"{log}: {key}" for log in want for key in want[log]
                     if got[log].get(key) != want[log][key])
    assert not changed, "snapshot bytes changed: " + ", ".join(changed[:12])


def test_a_snapshot_restores_to_the_same_bytes() -> None:
    """snapshot -> JSON -> restore -> snapshot is the identity (typed state round-trips)."""
    for name, (events, rules) in sorted(logs().items()):
        job = events[0].job_id
        engine = RuleEngine(job, rules)
        for e in events[: len(events) // 2]:
            engine.feed(e)
        raw = orjson.dumps(engine.snapshot())
        again = RuleEngine(job, rules, orjson.loads(raw))
        assert orjson.dumps(again.snapshot()) == raw, name


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        GOLDEN.write_text(json.dumps(digests(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN}")
