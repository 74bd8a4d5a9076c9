"""Config files are validated completely at load: a rule set, job spec, alerts config or scenario
that loads runs; one that would not gives ONE line naming the file, the field and the value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard.actuators.jobspec import JobSpecError, load_job_spec, parse_job_spec
from trainguard.alerts.config import ConfigError
from trainguard.alerts.config import load as load_alerts
from trainguard.drills.scenario import ScenarioError, builtin_dir, load_scenario
from trainguard.events.envelope import Event
from trainguard.events.payloads import CheckpointAction, NodeHealthKind
from trainguard.rules import RuleEngine, RuleError, load_rules, parse_rules
from trainguard.rules import synth as s
from trainguard.rules.params import KINDS, NUM, PARAMS

pytestmark = pytest.mark.unit

JOB = "hj"
T0 = 1_700_000_000_000_000


def _events() -> list[Event]:
    """A little of everything every rule kind reads, in event-time order."""
    out: list[Event] = list(s.job_steps(JOB, 4, 40, slow={1: (10, 2.5)}, noise=0.05))
    end = T0 + 40 * 200_000
    for i in range(12):
        t = T0 + i * 700_000
        temps = [65.0, 66.0, 64.0, 95.0 if i > 3 else 65.0]
        out.append(s.telemetry(JOB, "node-0", t + 1, i,
                               gpus=[s.gpu(g, temp=temps[g], util=90.0) for g in range(4)]))
        out.append(s.heartbeat(JOB, 2, t + 2))
    out += [s.node_health(JOB, "node-0", NodeHealthKind.XID, T0 + 3_000_001, code=79, gpu=1),
            s.node_health(JOB, "node-0", NodeHealthKind.XID, T0 + 3_000_002, code=13, gpu=2),
            s.node_health(JOB, "node-0", NodeHealthKind.LINK_DOWN, T0 + 3_000_003,
                          device="eth0"),
            s.process_exit(JOB, "node-0", 3, end + 5),
            s.checkpoint(JOB, CheckpointAction.LOADED, 20, end + 10)]
    out += [s.step_report(JOB, r, 21 + k, end + 100_000 * (k + 1) + r, 100.0,
                          world=4, loss=(9.0 if k > 2 else 1.0))
            for k in range(12) for r in range(3)]
    return sorted(out, key=lambda e: e.event_time)


EVENTS = _events()
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, 1, 2, -1, 0.5, 1e9, 1e9 + 1, 2**53, 2**63, 1e-300, 5e-324]),
)


def _run_engine(text: str) -> None:
    rules = parse_rules(text, "h.yaml")
    engine = RuleEngine(JOB, rules, prompt=True)
    for e in EVENTS:
        engine.feed(e)
    engine.flush()
    # the state it keeps survives the streams' changelog round trip
    RuleEngine(JOB, rules, snapshot=orjson.loads(orjson.dumps(engine.snapshot())))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(KINDS), data=st.data())
def test_any_numbers_load_into_a_rule_set_that_runs_or_give_one_line(kind: str,
                                                                     data: st.DataObject) -> None:
    names = [p.name for p in PARAMS[kind] if p.kind in (int, NUM)]
    params = data.draw(st.dictionaries(st.sampled_from(names), NUMBERS)) if names else {}
    doc: dict[str, Any] = {"rules": [{"id": "r", "kind": kind, "parameters": params}]}
    lateness = data.draw(st.one_of(st.none(), NUMBERS))
    if lateness is not None:
        doc["allowed_lateness_ms"] = lateness
    text = yaml.safe_dump(doc)
    try:
        _run_engine(text)
    except RuleError as err:
        assert err.problems
        for line in err.problems:
            assert "\n" not in line and line.startswith("h.yaml: "), line
            assert "field '" in line and "(got " in line, line


@pytest.mark.parametrize(("text", "field", "value"), [
    ("rules: [{id: l, kind: liveness, parameters: {floor_ms: .inf}}]", "floor_ms", "inf"),
    ("allowed_lateness_ms: .nan\nrules: []", "allowed_lateness_ms", "nan"),
    ("allowed_lateness_ms: -.inf\nrules: []", "allowed_lateness_ms", "-inf"),
    ("rules: [{id: s, kind: straggler, parameters: {burst_steps: 99999999999999999999}}]",
     "burst_steps", "99999999999999999999"),
    ("rules: [{id: x, kind: xid, parameters: {drain_codes: [79, -1]}}]", "drain_codes", "-1"),
    ("rules: [{id: h, kind: hw_outlier, parameters: {metrics: [\"\\ud800\"]}}]",
     "rules[0].parameters.metrics[0]", "ud800"),
    ("rules: [{id: h, kind: ecc, description: [1]}]", "description", "[1]"),
])
def test_the_reproduced_rule_values_are_refused_in_one_line(text: str, field: str,
                                                            value: str) -> None:
    with pytest.raises(RuleError) as err:
        parse_rules(text, "r.yaml")
    line = str(err.value)
    assert "\n" not in line and line.startswith("r.yaml: ")
    assert f"'{field}'" in line and value in line, line


def test_a_non_utf8_or_unreadable_rule_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("rules: []\n# caf\xe9\n".encode("latin-1"))
    with pytest.raises(RuleError, match=r"latin1\.yaml: not valid UTF-8 \(line 2, byte 15"):
        load_rules(bad)
    with pytest.raises(RuleError, match="cannot read: Is a directory"):
        load_rules(tmp_path)
    with pytest.raises(RuleError, match=r"y\.yaml: not YAML: line \d+ column \d+: expected"):
        load_rules(_write(tmp_path / "y.yaml", "rules: [unclosed\n"))


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


SPEC: dict[str, Any] = {"job_id": "j1", "world_size": 1, "ckpt_dir": "/data/ckpt",
                        "command": ["python", "-m", "w"], "units": [{"name": "u0", "rank": 0}]}


@pytest.mark.parametrize(("change", "field", "value"), [
    ({"job_id": "-starts-with-a-dash"}, "job_id", "-starts-with-a-dash"),
    ({"job_id": "has space"}, "job_id", "has space"),
    ({"job_id": "x" * 129}, "job_id", "xxxx"),
    ({"grace_s": float("inf")}, "grace_s", "inf"),
    ({"grace_s": float("nan")}, "grace_s", "nan"),
    ({"world_size": 10**12}, "world_size", "1000000000000"),
    ({"node": "n" * 300}, "node", "nnnn"),
    ({"log_dir": 5}, "log_dir", "5"),
    ({"env": {"A": "x\0y"}}, "env.A", "x\\x00y"),
    ({"command": ["python", 3]}, "command[1]", "3"),
    ({"units": [{"name": "../up", "rank": 0}]}, "units[0].name", "../up"),
    ({"units": [{"name": "u0", "rank": True}]}, "units[0].rank", "True"),
    ({"units": [{"name": "u0", "rank": 0, "cpus": [10**9]}]}, "units[0].cpus", "1000000000"),
    ({"units": [{"name": "", "rank": 0}]}, "units[0].name", "''"),
])
def test_a_job_spec_that_breaks_the_contract_is_refused(change: dict[str, Any], field: str,
                                                        value: str) -> None:
    with pytest.raises(JobSpecError) as err:
        parse_job_spec({**SPEC, **change}, "job.yaml")
    line = str(err.value)
    assert "\n" not in line and line.startswith("job.yaml: ")
    assert f"'{field}'" in line and value in line, line


def test_a_job_spec_file_is_utf8_yaml(tmp_path: Path) -> None:
    bad = tmp_path / "job.yaml"
    bad.write_bytes(b"job_id: j\xff\n")
    with pytest.raises(JobSpecError, match=r"job\.yaml: not valid UTF-8"):
        load_job_spec(bad)
    assert load_job_spec(_write(tmp_path / "ok.yaml", yaml.safe_dump(SPEC))).job_id == "j1"


@pytest.mark.parametrize(("limits", "field"), [
    ("limits: [{count: 1, per_s: .inf}]", "channels.0.limits.0.per_s"),
    ("limits: [{count: 1, per_s: .nan}]", "channels.0.limits.0.per_s"),
    ("resend_s: .inf", "channels.0.resend_s"),
    ("retry: {base_s: .inf}", "channels.0.retry.base_s"),
])
def test_alerts_numbers_are_finite(tmp_path: Path, limits: str, field: str) -> None:
    path = _write(tmp_path / "a.yaml", "channels: [{name: a, type: alertmanager, "
                  f"url: 'http://h:9093', {limits}}}]\n")
    with pytest.raises(ConfigError) as err:
        load_alerts(path, {})
    assert err.value.field == field and "\n" not in str(err.value)


def test_a_scenario_number_is_finite(tmp_path: Path) -> None:
    doc = yaml.safe_load((builtin_dir() / "r1-hang.yaml").read_text())
    for bad in (float("inf"), float("nan"), 10**20):
        path = _write(tmp_path / "s.yaml", yaml.safe_dump({**doc, "duration_s": bad}))
        with pytest.raises(ScenarioError, match="'duration_s': must be finite") as err:
            load_scenario(path)
        assert "\n" not in str(err.value)
    path = tmp_path / "b.yaml"
    path.write_bytes(b"name: \xff\n")
    with pytest.raises(ScenarioError, match="not valid UTF-8"):
        load_scenario(path)


ANY_SCALAR = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=12),
                       st.sampled_from(["{rank}", "{rank.x}", "{rank[0]}", "{0}", "{nope}",
                                        "{rank!z}", "a\0b", "-x", "u/0", ""]))
ANY_VALUE = st.recursive(ANY_SCALAR, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(["name", "cpus", "rank", "labels", "x", "A"]), inner,
                    max_size=4)), max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(changes=st.dictionaries(st.sampled_from(sorted({*SPEC, "node", "grace_s", "env",
                                                       "log_dir", "preload"})),
                               ANY_VALUE, max_size=3))
def test_any_job_spec_loads_into_one_that_launches_or_gives_one_line(
        changes: dict[str, Any]) -> None:
    try:
        spec = parse_job_spec({**SPEC, **changes}, "job.yaml")
    except JobSpecError as err:
        assert "\n" not in str(err) and str(err).startswith("job.yaml: "), str(err)
        return
    for unit in spec.units:  # everything a launch reads from the spec
        assert all(isinstance(a, str) and "\0" not in a
                   for a in spec.argv(unit.rank or 0, 1, 1234, unit.name))
        assert all(c >= 0 for c in unit.cpus)
    assert all("\0" not in k + v for k, v in spec.env.items())
    assert 0 <= spec.grace_s < float("inf") and spec.node and str(spec.ckpt_dir)


def test_a_unit_placeholder_in_env_is_the_units_name_and_nothing_else_expands() -> None:
    spec = parse_job_spec({**SPEC, "env": {"TRAINGUARD_AGENT_SOCKET": "/run/tg/{unit}/a.sock",
                                           "OTHER": "$HOME {rank} {unit}{unit}"}}, "job.yaml")
    name = spec.units[0].name
    assert spec.env_for(name) == {"TRAINGUARD_AGENT_SOCKET": f"/run/tg/{name}/a.sock",
                                  "OTHER": f"$HOME {{rank}} {name}{name}"}
    assert spec.env["TRAINGUARD_AGENT_SOCKET"] == "/run/tg/{unit}/a.sock"  # the spec as written
