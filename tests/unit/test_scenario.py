"""Scenario files: the shipped ones load; bad ones fail naming the file, scenario and field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.drills.scenario import (
    FAULT_KINDS,
    ScenarioError,
    builtin_scenarios,
    load_scenario,
    parse_scenario,
    resolve,
)

GOOD: dict[str, Any] = {
    "name": "t-exit", "round": 1, "title": "a kill",
    "fault": {"kind": "worker_exit", "target": {"rank": 1}, "params": {"signal": "SIGKILL"}},
    "duration_s": 0,
    "expect": {"verdicts": ["process_exit"], "actions": ["migrate"], "resumed": True,
               "incident": "recovered"},
    "stop_conditions": [{"kind": "no_progress_s", "value": 60}],
    "rollback": {"action": "none", "when": ["end", "abort"]},
}


def bad(**changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    for path, value in changes.items():
        node = doc
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[k]
        if value is ...:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
    return doc


def test_builtin_scenarios_cover_the_three_rounds_and_every_required_fault() -> None:
    scenarios = builtin_scenarios()
    kinds = {(s.round, s.fault.kind) for s in scenarios}
    assert {(1, "link"), (1, "worker_exit"), (2, "node_loss"), (3, "storage_stall"),
            (3, "storage_loss"), (3, "checkpoint_corruption"), (3, "broker_outage")} <= kinds
    assert {s.fault.kind for s in scenarios} == set(FAULT_KINDS)
    assert len({s.name for s in scenarios}) == len(scenarios)
    for s in scenarios:
        assert s.rollback.action in FAULT_KINDS[s.fault.kind].rollbacks
        assert s.stop_conditions
    by_name = {s.name: s for s in scenarios}
    assert by_name["r1-link-loss"].expect.tolerate == ("job_slowdown",)
    assert by_name["r1-worker-exit"].expect.tolerate == ()


def test_a_good_scenario_parses_with_defaults() -> None:
    s = parse_scenario(GOOD, "x.yaml")
    assert (s.fault.kind, s.fault.rank, s.fault.target) == ("worker_exit", 1, "rank-1")
    assert s.fault.params == {"signal": "SIGKILL"}
    assert s.expect.actions == ("migrate",) and s.expect.resumed
    assert s.preconditions.steady_steps == 5 and s.observe.settle_steps == 10


@pytest.mark.parametrize(("doc", "field", "reason"), [
    (bad(fault__kind="meteor"), "fault.kind", "one of"),
    (bad(fault=[GOOD["fault"], GOOD["fault"]]), "fault", "exactly one fault"),
    (bad(fault__target={}), "fault.target.rank", "required"),
    (bad(fault__params={"signal": "SIGHUP"}), "fault.params.signal", "SIGKILL"),
    (bad(fault__params={}), "fault.params.signal", "required"),
    (bad(fault__params={"signal": "SIGKILL", "bogus": 1}), "fault.params.bogus", "unknown"),
    (bad(duration_s=-1), "duration_s", ">= 0"),
    (bad(stop_conditions=[]), "stop_conditions", "non-empty"),
    (bad(stop_conditions=[{"kind": "never", "value": 1}]), "stop_conditions[0].kind", "one of"),
    (bad(stop_conditions=[{"kind": "restarts_over", "value": 1.5}]),
     "stop_conditions[0].value", "integer"),
    (bad(rollback={"action": "thaw"}), "rollback.action", "for worker_exit"),
    (bad(rollback={"action": "none", "when": ["later"]}), "rollback.when[0]", "one of"),
    (bad(expect__incident="fine"), "expect.incident", "one of"),
    (bad(expect__actions=["reboot"]), "expect.actions[0]", "one of"),
    (bad(expect__resumed="yes"), "expect.resumed", "true or false"),
    (bad(expect__tolerate="job_slowdown"), "expect.tolerate", "list of strings"),
    (bad(name="Bad Name"), "name", "must match"),
    (bad(rollback=...), "rollback", "required"),
    (bad(colour="red"), "colour", "unknown field"),
    (bad(preconditions={"steady_steps": "many"}), "preconditions.steady_steps", "integer"),
])
def test_bad_fields_are_named(doc: dict[str, Any], field: str, reason: str) -> None:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc, "drills/x.yaml")
    err = info.value
    assert err.field == field, str(err)
    assert reason in err.reason
    assert str(err).startswith("drills/x.yaml: scenario ")


def test_mode_specific_params_are_required() -> None:
    doc = bad(fault={"kind": "link", "params": {"mode": "loss"}}, duration_s=5,
              rollback={"action": "remove_fault"})
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc)
    assert info.value.field == "fault.params.loss_pct"
    doc["fault"]["params"]["loss_pct"] = 150
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc)
    assert info.value.field == "fault.params.loss_pct" and "1..100" in info.value.reason


def test_a_held_fault_needs_a_duration() -> None:
    doc = bad(fault={"kind": "hang", "target": {"rank": 0}}, rollback={"action": "sigcont"})
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc)
    assert info.value.field == "duration_s"


def test_on_as_a_yaml_key_is_refused_by_name(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    doc = bad()
    p.write_text(yaml.safe_dump(doc).replace("when:", "on:"))
    with pytest.raises(ScenarioError) as info:
        load_scenario(p)
    assert info.value.where == str(p) and info.value.scenario == "t-exit"
    assert info.value.field.startswith("rollback.")


def test_unreadable_and_non_yaml_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")
    p = tmp_path / "broken.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match="not YAML") as info:
        load_scenario(p)
    assert info.value.where == str(p)


def test_resolve_by_name_round_file_and_all(tmp_path: Path) -> None:
    assert [s.name for s in resolve(["r1-worker-exit"])] == ["r1-worker-exit"]
    assert {s.round for s in resolve(["round:3"])} == {3}
    assert len(resolve(["all"])) == len(builtin_scenarios())
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump(GOOD))
    assert resolve([str(p)])[0].source == str(p)
    with pytest.raises(ScenarioError, match="not a built-in scenario"):
        resolve(["nope"])


def test_a_scenario_named_twice_runs_once_and_two_under_one_name_are_refused(
        tmp_path: Path) -> None:
    """A run keeps one directory per scenario: a second run of one would overwrite the
    first's evidence (``drill run r3-ckpt-corruption r3-ckpt-corruption`` did)."""
    twice = resolve(["r3-ckpt-corruption", "round:3", "r3-ckpt-corruption"])
    assert len(twice) == len({s.name for s in twice}) == len(resolve(["round:3"]))
    p = tmp_path / "mine.yaml"
    p.write_text(yaml.safe_dump({**GOOD, "name": "r1-worker-exit"}))
    with pytest.raises(ScenarioError, match="two different scenarios have this name"):
        resolve(["r1-worker-exit", str(p)])


def test_a_trigger_is_only_for_checkpoint_corruption_and_only_a_worker_exit() -> None:
    s = resolve(["r3-ckpt-corruption"])[0]
    assert s.trigger is not None and s.trigger.kind == "worker_exit" and s.trigger.rank == 1
    doc = bad(trigger={"kind": "worker_exit", "target": {"rank": 0},
                       "params": {"signal": "SIGKILL"}})
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc)
    assert info.value.field == "trigger"
    corrupt = bad(fault={"kind": "checkpoint_corruption", "params": {"mode": "truncate"}},
                  trigger={"kind": "hang", "target": {"rank": 0}})
    with pytest.raises(ScenarioError) as info:
        parse_scenario(corrupt)
    assert info.value.field == "trigger.kind"
    corrupt["trigger"] = {"kind": "worker_exit", "target": {}, "params": {"signal": "SIGKILL"}}
    with pytest.raises(ScenarioError) as info:
        parse_scenario(corrupt)
    assert info.value.field == "trigger.target.rank"


@pytest.mark.parametrize("name", ["r3-storage-stall", "r3-storage-loss"])
def test_a_storage_fault_needs_the_local_stack_s_loop_file_system(name: str) -> None:
    path = next(p for p in resolve([name]) if p.name == name).source
    doc = yaml.safe_load(Path(path).read_text())
    assert parse_scenario(doc).stack == "local"
    with pytest.raises(ScenarioError) as info:
        parse_scenario({**doc, "stack": "slurm"}, "drills/x.yaml")
    assert info.value.field == "stack" and "loop-mounted" in info.value.reason


def test_a_torchrun_launcher_is_the_clusters_and_names_a_known_launcher() -> None:
    path = next(p for p in resolve(["slurm-elastic-node-loss"])).source
    doc = yaml.safe_load(Path(path).read_text())
    assert parse_scenario(doc).launcher == "torchrun"
    assert parse_scenario({k: v for k, v in doc.items() if k != "launcher"}).launcher == "srun"
    with pytest.raises(ScenarioError) as info:
        parse_scenario({**doc, "launcher": "mpirun"}, "drills/x.yaml")
    assert info.value.field == "launcher" and "one of srun, torchrun" in info.value.reason
    local = yaml.safe_load(Path(next(p for p in resolve(["r1-worker-exit"])).source).read_text())
    with pytest.raises(ScenarioError) as info:
        parse_scenario({**local, "launcher": "torchrun"}, "drills/x.yaml")
    assert info.value.field == "launcher" and "stack must be slurm" in info.value.reason
