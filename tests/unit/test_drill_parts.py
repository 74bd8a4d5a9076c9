"""The pure parts around the drill runner: the live view and stop conditions, regression
diffs, the baseline from progress logs, the archive freeze, the job spec, reports."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trainguard.actuators.jobspec import parse_job_spec
from trainguard.drills.baseline import baseline_from_progress, freeze
from trainguard.drills.evidence import EvidenceInput, evaluate
from trainguard.drills.injectors.base import Acted, InjectionError
from trainguard.drills.injectors.cluster import InOutage
from trainguard.drills.job import DrillJob
from trainguard.drills.live import stable, steady, stop_reason, view
from trainguard.drills.regression import diff
from trainguard.drills.report import index_markdown, scenario_html, scenario_markdown
from trainguard.drills.scenario import Expect, StopCondition, resolve
from trainguard.drills.synth import JOB, T0, Knobs, synth_drill
from trainguard.events.payloads import VerdictKind

EXPECT = Expect(verdicts=(VerdictKind.PROCESS_EXIT,), actions=("migrate",))


def test_view_counts_steps_epochs_checkpoints_and_spares() -> None:
    events, _, _ = synth_drill(Knobs(world=2))
    v = view(events, base_epoch=1)
    assert v.epoch == 2 and v.epochs_after == 1 and v.checkpoints == 4
    assert v.steps_at_epoch == {0: 20, 1: 20} and v.max_step == 40
    assert steady(v, 2, 5, 1, 0) is None
    assert "spare" in (steady(v, 2, 5, 1, 1) or "")
    assert "3 ranks" in (steady(v, 3, 5, 1, 0) or "")
    assert stable(v, 2, 10) and not stable(v, 2, 21)
    late = view(events, since_us=T0 + 10**12)
    assert late.steps_at_epoch == {} and not stable(late, 2, 1)


def test_stop_conditions_name_what_held() -> None:
    events, _, _ = synth_drill(Knobs())
    v = view(events, base_epoch=1)
    conds = [StopCondition("no_progress_s", 30), StopCondition("restarts_over", 0),
             StopCondition("replicas_over", 1), StopCondition("wall_s", 100)]
    common = {"now_us": T0 + 10**6, "fault_us": T0, "last_progress_us": T0}
    assert (stop_reason(conds, v, max_live={0: 1}, **common) or "").startswith("restarts_over")
    assert stop_reason(conds[:1], v, max_live={}, now_us=T0 + 31 * 10**6, fault_us=T0,
                       last_progress_us=T0) is not None
    assert "replicas_over" in (stop_reason(conds[2:3], v, max_live={1: 2}, **common) or "")
    assert stop_reason(conds[2:], v, max_live={0: 1, 1: 1}, **common) is None


def test_regression_diff_lists_only_changes() -> None:
    before = {"a": "recovered automatically", "b": "retest"}
    after = {"a": "recovered automatically", "b": "needs manual restart", "c": "retest"}
    assert diff(before, after) == ["b: retest -> needs manual restart", "c: new (retest)"]
    assert diff(after, after) == []


def test_baseline_from_progress_lines() -> None:
    lines = [{"kind": "start", "rank": 0}] + [
        {"kind": "step", "rank": r, "step": s, "loss": 1.0 / s + r, "time": 100.0 + s * 0.05}
        for r in range(2) for s in range(1, 6)]
    b = baseline_from_progress(lines)
    assert b.losses[(1, 5)] == 1.2 and len(b.losses) == 10
    assert b.step_ms_median is not None and abs(b.step_ms_median - 50.0) < 1e-6


def test_the_drill_job_spec_is_a_valid_local_backend_spec(tmp_path: Path) -> None:
    job = DrillJob()
    spec = parse_job_spec(job.spec(job_id="j1", ckpt_dir=tmp_path / "c", run_dir=tmp_path,
                                   node="n", agent_socket=tmp_path / "a.sock"))
    assert spec.world_size == 4 and len(spec.units) == 4 + job.spares
    cores = [u.cpus for u in spec.units]  # two ranks per core, before and after a node loss
    assert cores == [(0,), (1,), (0,), (1,), (1,), (0,), (1,)]
    argv = spec.argv(1, 2, 5555, "u1")
    assert "--progress-file" in argv and argv[argv.index("--progress-file") + 1].endswith(
        "rank1-e2.jsonl")
    assert spec.env["OMP_NUM_THREADS"] == "1"
    assert job.node_units("node-b") == ["u1", "u2", "u3"]


def test_freeze_writes_the_five_archives() -> None:
    events, _, _ = synth_drill(Knobs())
    s = resolve(["r1-worker-exit"])[0]
    a = freeze(run_id="r", scenario=s, job=DrillJob(), job_id=JOB, spec_text="spec",
               ckpt_dir=Path("/c"), events=events, signer="alice",
               code={"commit": "abc", "dirty": False}, rt={"python": "3.11"})
    for part in ("task", "data", "resources", "recovery", "responsibility", "randomness"):
        assert a[part], part
    assert a["task"]["code_version"]["commit"] == "abc"
    assert a["data"]["read_position"]["step"] == 40
    assert a["responsibility"]["signs_off"] == "alice"
    assert a["recovery"]["checkpoint_policy"] == {"every_steps": 10, "keep": 3}
    assert set(a["resources"]["scheduling"]) == {"0", "1"}


def test_reports_say_the_conclusion_and_cite_events() -> None:
    events, b, art = synth_drill(Knobs())
    s = dataclasses.replace(resolve(["r1-worker-exit"])[0], expect=EXPECT)
    ev = evaluate(EvidenceInput(JOB, events, EXPECT, 1e-3, 10, b, art))
    md = scenario_markdown(s, ev, {"run_id": "r1", "recovery": {"checkpoint_bytes": 999}},
                           events, DrillJob().to_dict())
    assert "**Conclusion: recovered automatically**" in md
    assert "| progress | resumed_from_last_valid_checkpoint | pass |" in md
    assert "`ev0000" in md and "not an SLA" in md and "checkpoint size: 999 bytes" in md
    assert "migrate" in md and "trainguard drill verify r1" in md
    page = scenario_html("t", ev, md, ["<html>timeline</html>"])
    assert page.count("<table>") == 2 and "recovered automatically" in page
    assert "srcdoc=" in page
    idx = index_markdown("r1", [("r1-worker-exit", "1", "retest")], {"r1-link-loss": "why"})
    assert "Combinations not yet verified" in idx and "r1-link-loss: why" in idx


def test_netwrap_argv_and_the_namespaced_spec(tmp_path: Path) -> None:
    import pytest

    from trainguard.drills.netwrap import argv_for

    got = argv_for({"u1": ["ns-b", "vb"]}, "u1", ["python", "-m", "x"])
    assert got == ["ip", "netns", "exec", "ns-b", "env", "GLOO_SOCKET_IFNAME=vb", "python",
                   "-m", "x"]
    with pytest.raises(KeyError, match="u9"):
        argv_for({}, "u9", ["x"])
    spec = parse_job_spec(DrillJob().spec(job_id="j", ckpt_dir=tmp_path, run_dir=tmp_path,
                                          node="n", agent_socket=tmp_path / "s",
                                          netns=(tmp_path / "m.json", "10.1.2.1")))
    argv = spec.argv(0, 1, 99, "u0")
    assert argv[1:4] == ["-m", "trainguard.drills.netwrap", "--map"]
    assert argv[argv.index("--unit") + 1] == "u0"
    assert argv[argv.index("--master-addr") + 1] == "10.1.2.1"


def test_recorded_events_stop_at_the_window_and_evaluate_from_files(tmp_path: Path) -> None:
    import json

    from trainguard.drills.logtail import write_jsonl
    from trainguard.drills.runner import evaluate_run, recorded_events

    events, base, art = synth_drill(Knobs())
    write_jsonl(tmp_path / "events.jsonl", events)
    cut = events[len(events) // 2].event_time
    archive = {"run_id": "r", "task": {"job_id": JOB}, "window": {"closed_us": cut},
               "artifacts": art.to_dict()}
    kept = recorded_events(tmp_path, archive)
    assert kept and all(e.event_time <= cut for e in kept) and len(kept) < len(events)
    archive["window"] = {"closed_us": None}
    (tmp_path / "archive.json").write_text(json.dumps(archive))
    s = dataclasses.replace(resolve(["r1-worker-exit"])[0], expect=EXPECT)
    ev = evaluate_run(tmp_path, s, base)
    assert ev.conclusion.value == "recovered automatically", ev.reasons


class _Fake:
    def __init__(self, name: str, calls: list[str], fail: bool = False) -> None:
        self.name, self.calls, self.fail = name, calls, fail

    def inject(self) -> Acted:
        self.calls.append(f"{self.name}.inject")
        if self.fail:
            raise InjectionError(f"{self.name} failed")
        return Acted(len(self.calls), {"what": self.name})

    def undo(self) -> Acted:
        self.calls.append(f"{self.name}.undo")
        return Acted(len(self.calls), {"undone": self.name})


def test_a_fault_in_an_outage_brings_the_broker_back_whatever_happens() -> None:
    calls: list[str] = []
    both = InOutage(_Fake("broker", calls), _Fake("node", calls))
    acted = both.inject()
    assert calls == ["broker.inject", "node.inject"]
    assert acted.at_us == 2 and acted.params == {"what": "node", "broker_what": "broker"}
    both.undo()
    assert calls[2:] == ["broker.undo", "node.undo"]
    calls.clear()
    failing = InOutage(_Fake("broker", calls), _Fake("node", calls, fail=True))
    with pytest.raises(InjectionError, match="node failed"):
        failing.inject()
    assert calls == ["broker.inject", "node.inject", "broker.undo"]  # never left down
