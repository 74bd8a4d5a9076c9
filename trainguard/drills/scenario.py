"""Drill scenarios as YAML files, validated with errors that name the file, the scenario and
the field.

A scenario holds exactly one injected fault::

    name: r1-worker-exit            # unique; [a-z0-9-]
    round: 1                        # rounds escalate one variable at a time
    title: One rank killed with SIGKILL
    preconditions: {steady_steps: 5, checkpoints: 1, spares: 1}
    fault:
      kind: worker_exit             # one of FAULT_KINDS
      target: {rank: 1}             # rank | node | (nothing: the job's storage / the broker)
      params: {signal: SIGKILL}
    duration_s: 0                   # how long the fault is held before it is rolled back
    expect:                         # the states the loop should pass through
      verdicts: [process_exit]
      actions: [migrate]
      resumed: true                 # the job continues from a checkpoint at a new epoch
      incident: recovered
    stop_conditions:                # abort the drill (and roll back) as soon as one holds
      - {kind: no_progress_s, value: 120}
      - {kind: restarts_over, value: 3}
    rollback: {action: none, when: [end, abort]}   # "when", not "on": YAML 1.1 reads on as true
    observe: {settle_steps: 10, timeout_s: 180}
    tolerance: {loss_abs: 0.001}

Parsing is pure (``parse_scenario``); ``load_scenario`` reads a file; ``builtin_scenarios``
reads the ones shipped in ``trainguard/drills/scenarios/``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Final

from trainguard.configfile import ConfigFileError, finite_in, load_yaml, show
from trainguard.drills.job import Launcher
from trainguard.events.payloads import CommandAction, IncidentState, VerdictKind

MAX_NUMBER: Final = 1e9  # no number in a scenario is larger (seconds, counts, ratios)
NAME_RE: Final = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class ScenarioError(ValueError):
    """A scenario that cannot be run: ``where`` (file), ``scenario`` and ``field`` say what."""

    def __init__(self, where: str, scenario: str, field_name: str, reason: str) -> None:
        super().__init__(f"{where}: scenario {scenario!r}: field {field_name!r}: {reason}")
        self.where = where
        self.scenario = scenario
        self.field = field_name
        self.reason = reason


@dataclass(frozen=True)
class FaultKind:
    """What a fault kind needs: its target, its params (name -> allowed values or a type) and
    the rollback actions that undo it."""

    target: str  # "rank" | "node" | "none"
    params: Mapping[str, tuple[Any, ...] | type | tuple[type, ...]]
    required: tuple[str, ...]
    rollbacks: tuple[str, ...]
    held: bool  # True: the fault lasts duration_s and is then rolled back


FAULT_KINDS: Final[Mapping[str, FaultKind]] = {
    "worker_exit": FaultKind("rank", {"signal": ("SIGKILL", "SIGTERM")}, ("signal",),
                             ("none",), held=False),
    "hang": FaultKind("rank", {}, (), ("sigcont",), held=True),
    "slowdown": FaultKind("rank", {"method": ("cgroup", "sigstop_duty"),
                                   "cpu_pct": (int, float), "stop_ms": int, "run_ms": int},
                          ("method",), ("remove_quota", "sigcont"), held=True),
    "link": FaultKind("none", {"mode": ("latency", "loss", "throttle", "down", "flap"),
                               "latency_ms": int, "jitter_ms": int, "loss_pct": int,
                               "rate": str, "flaps": int, "hold_ms": int},
                      ("mode",), ("remove_fault",), held=True),
    "node_loss": FaultKind("node", {"signal": ("SIGKILL", "SIGTERM")}, ("signal",),
                           ("none",), held=False),
    "storage_stall": FaultKind("none", {"method": ("fsfreeze",)}, ("method",), ("thaw",),
                               held=True),
    "storage_loss": FaultKind("none", {"method": ("readonly", "unmount")}, ("method",),
                              ("remount_rw",), held=True),
    "checkpoint_corruption": FaultKind("none", {"mode": ("truncate", "bitflip"),
                                                "which": ("newest",)},
                                       ("mode",), ("none", "restore_copy"), held=False),
    "broker_outage": FaultKind("none", {"mode": ("stop", "kill")}, ("mode",),
                               ("start_broker",), held=True),
    # a node of the Slurm cluster lost as nodes go: its link down, then every process of its
    # network namespace (slurmd, the agent, the ranks) killed
    "cluster_node_loss": FaultKind("node", {}, (), ("none",), held=False),
    # a node of the Slurm cluster cut off the network (nftables drops everything to and from
    # it) with everything on it left running; lifted at the end
    "cluster_partition": FaultKind("node", {}, (), ("remove_fault",), held=True),
    # the head (broker, slurmctld, the loop) cut off from every node of the Slurm cluster,
    # the nodes still reaching each other; lifted at the end
    "cluster_head_partition": FaultKind("none", {}, (), ("remove_fault",), held=True),
    # the broker stopped (or killed), then a node of the Slurm cluster lost while it is away;
    # the broker started again at the end of the hold, the node stays lost
    "cluster_node_loss_in_broker_outage": FaultKind("node", {"mode": ("stop", "kill")},
                                                    ("mode",), ("start_broker",), held=True),
}

# Where a scenario runs: ``local`` (the job's ranks launched by the local backend on this
# machine) or ``slurm`` (the dev Slurm cluster, 3 nodes + 1 spare with an agent each, the job's
# ranks launched as steps by the slurm backend). Faults that need the cluster:
STACKS: Final = ("local", "slurm")
CLUSTER_ONLY: Final = frozenset({"cluster_node_loss", "cluster_partition",
                                  "cluster_node_loss_in_broker_outage",
                                  "cluster_head_partition"})
# ... and of those, the ones that take a node out of service: the evidence checks nothing is
# bound there again
NODE_LOST: Final = frozenset({"node_loss", "cluster_node_loss", "cluster_partition",
                               "cluster_node_loss_in_broker_outage"})
# ... and those that act on the drill's loop-mounted checkpoint file system, which only the
# local stack has (the cluster's checkpoints are in its shared directory: ``slurmd`` runs in
# its own mount namespace and would not see a file system mounted after it started)
LOOP_FS_ONLY: Final = frozenset({"storage_stall", "storage_loss"})

STOP_KINDS: Final = {"no_progress_s": (int, float), "restarts_over": int, "replicas_over": int,
                     "wall_s": (int, float)}
# what a scenario may expect an incident to end as: an end state (recovered, escalated,
# unrecoverable, ended), or no incident at all
INCIDENT_ENDS: Final = (*(s.value for s in IncidentState if not s.active), "none")
ROLLBACK_WHEN: Final = ("end", "abort")


@dataclass(frozen=True)
class Preconditions:
    steady_steps: int = 5  # every rank reported this many steps at the current epoch
    checkpoints: int = 1  # at least this many checkpoints written
    spares: int = 0  # at least this many spare units


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int | None = None
    node: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def target(self) -> str | None:
        if self.rank is not None:
            return f"rank-{self.rank}"
        return f"node-{self.node}" if self.node is not None else None


@dataclass(frozen=True)
class Expect:
    verdicts: tuple[VerdictKind, ...] = ()
    actions: tuple[str, ...] = ()
    resumed: bool = True
    incident: str = "recovered"
    checkpoint_corrupt: bool = False  # a corrupt checkpoint event is expected (and explained)
    # verdict kinds the fault may cause that need no action (a job slowing while its link
    # drops packets): with ``incident: none``, incidents opened only by these pass when they
    # recovered; they are never required
    tolerate: tuple[VerdictKind, ...] = ()


@dataclass(frozen=True)
class StopCondition:
    kind: str
    value: float


@dataclass(frozen=True)
class Rollback:
    action: str
    when: tuple[str, ...] = ROLLBACK_WHEN


@dataclass(frozen=True)
class Observe:
    settle_steps: int = 10  # steps at the new epoch after which the job counts as stable
    timeout_s: float = 180.0  # the observation window's end at the latest
    before_s: float = 5.0  # the window opens this long before the fault


@dataclass(frozen=True)
class Tolerance:
    loss_abs: float = 1e-3


@dataclass(frozen=True)
class Scenario:
    name: str
    round: int
    title: str
    fault: Fault
    duration_s: float
    expect: Expect
    stop_conditions: tuple[StopCondition, ...]
    rollback: Rollback
    preconditions: Preconditions = Preconditions()
    observe: Observe = Observe()
    tolerance: Tolerance = Tolerance()
    description: str = ""
    source: str = "<memory>"
    trigger: Fault | None = None
    stack: str = "local"  # one of STACKS
    launcher: Launcher = Launcher.SRUN  # how the slurm stack starts the job's ranks


_TOP: Final = {"name", "round", "title", "description", "preconditions", "fault", "duration_s",
               "expect", "stop_conditions", "rollback", "observe", "tolerance", "trigger",
               "stack", "launcher"}
# A trigger is not a second fault under test: it is round 1's proven worker exit, used only to
# make the loop read what the fault changed (a corrupt checkpoint is found only at a resume).
TRIGGERED_KINDS: Final = ("checkpoint_corruption",)
_REQUIRED: Final = ("name", "round", "title", "fault", "duration_s", "expect",
                    "stop_conditions", "rollback")


class _Ctx:
    def __init__(self, where: str, scenario: str) -> None:
        self.where, self.scenario = where, scenario

    def fail(self, field_name: str, reason: str) -> ScenarioError:
        return ScenarioError(self.where, self.scenario, field_name, reason)

    def mapping(self, value: Any, field_name: str, known: set[str]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field_name, f"must be a mapping (got {value!r})")
        extra = sorted(str(k) for k in set(value) - known)
        if extra:
            raise self.fail(f"{field_name}.{extra[0]}" if field_name else extra[0],
                            f"unknown field (known: {', '.join(sorted(known))})")
        return value

    def number(self, value: Any, field_name: str, *, minimum: float = 0,
               integer: bool = False) -> float:
        ok = isinstance(value, int) if integer else isinstance(value, int | float)
        if not ok or isinstance(value, bool):
            kind = "an integer" if integer else "a number"
            raise self.fail(field_name, f"must be {kind} (got {value!r})")
        if not finite_in(value, -MAX_NUMBER, MAX_NUMBER):
            raise self.fail(field_name, f"must be finite and at most {MAX_NUMBER:g} "
                            f"(got {show(value)})")
        if value < minimum:
            raise self.fail(field_name, f"must be >= {minimum} (got {value!r})")
        return float(value)

    def strings(self, value: Any, field_name: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(field_name, f"must be a list of strings (got {value!r})")
        return tuple(value)


def parse_scenario(doc: Any, where: str = "<memory>") -> Scenario:
    """A scenario from a parsed YAML document; ``ScenarioError`` names the first bad field."""
    name_raw = doc.get("name") if isinstance(doc, dict) else None
    ctx = _Ctx(where, str(name_raw) if name_raw is not None else "?")
    top = ctx.mapping(doc, "", _TOP)
    for req in _REQUIRED:
        if req not in top:
            raise ctx.fail(req, "required")
    name = top["name"]
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise ctx.fail("name", f"must match {NAME_RE.pattern} (got {name!r})")
    rnd = int(ctx.number(top["round"], "round", minimum=1, integer=True))
    title = top["title"]
    if not isinstance(title, str) or not title.strip():
        raise ctx.fail("title", "a non-empty string")
    description = top.get("description", "")
    if not isinstance(description, str):
        raise ctx.fail("description", "a string")
    fault = _fault(ctx, top["fault"])
    duration = ctx.number(top["duration_s"], "duration_s")
    kind = FAULT_KINDS[fault.kind]
    if kind.held and duration <= 0:
        raise ctx.fail("duration_s", f"{fault.kind} is held for a while: must be > 0")
    stack = top.get("stack", "local")
    if stack not in STACKS:
        raise ctx.fail("stack", f"one of {', '.join(STACKS)} (got {stack!r})")
    if fault.kind in CLUSTER_ONLY and stack != "slurm":
        raise ctx.fail("stack", f"{fault.kind} needs the cluster: stack must be slurm "
                       f"(got {stack!r})")
    raw = top.get("launcher", Launcher.SRUN.value)
    if raw not in {m.value for m in Launcher}:
        raise ctx.fail("launcher", f"one of {', '.join(m.value for m in Launcher)} "
                       f"(got {raw!r})")
    launcher = Launcher(raw)
    if launcher is not Launcher.SRUN and stack != "slurm":
        raise ctx.fail("launcher", f"{launcher} runs the job on the cluster: stack must be "
                       f"slurm (got {stack!r})")
    if fault.kind in LOOP_FS_ONLY and stack != "local":
        raise ctx.fail("stack", f"{fault.kind} acts on the drill's loop-mounted file system, "
                       f"which only the local stack has: stack must be local (got {stack!r})")
    trigger = None
    if "trigger" in top:
        if fault.kind not in TRIGGERED_KINDS:
            raise ctx.fail("trigger", f"only {', '.join(TRIGGERED_KINDS)} takes a trigger "
                           "(one fault per scenario)")
        trigger = _fault(ctx, top["trigger"], "trigger")
        if trigger.kind != "worker_exit":
            raise ctx.fail("trigger.kind", f"worker_exit only (got {trigger.kind!r})")
    return Scenario(
        trigger=trigger, name=name, round=rnd, title=title.strip(), description=description.strip(),
        fault=fault, duration_s=duration, expect=_expect(ctx, top["expect"]),
        stop_conditions=_stops(ctx, top["stop_conditions"]),
        rollback=_rollback(ctx, top["rollback"], fault.kind),
        preconditions=_pre(ctx, top.get("preconditions", {})),
        observe=_observe(ctx, top.get("observe", {})),
        tolerance=_tolerance(ctx, top.get("tolerance", {})), source=where, stack=stack,
        launcher=launcher)


def _fault(ctx: _Ctx, doc: Any, at: str = "fault") -> Fault:
    if isinstance(doc, list):
        raise ctx.fail(at, f"exactly one fault per scenario (got a list of {len(doc)})")
    f = ctx.mapping(doc, at, {"kind", "target", "params"})
    kind_name = f.get("kind")
    if not isinstance(kind_name, str) or kind_name not in FAULT_KINDS:
        raise ctx.fail(f"{at}.kind", f"one of {', '.join(FAULT_KINDS)} (got {kind_name!r})")
    kind = FAULT_KINDS[kind_name]
    target = ctx.mapping(f.get("target", {}) or {}, f"{at}.target", {"rank", "node"})
    rank = node = None
    if kind.target == "rank":
        if "rank" not in target:
            raise ctx.fail(f"{at}.target.rank", f"required for {kind_name}")
        rank = int(ctx.number(target["rank"], f"{at}.target.rank", integer=True))
    elif kind.target == "node":
        node = target.get("node")
        if not isinstance(node, str) or not node:
            raise ctx.fail(f"{at}.target.node", f"a node name, required for {kind_name}")
    elif target:
        raise ctx.fail(f"{at}.target", f"{kind_name} takes no target (got {target!r})")
    params = ctx.mapping(f.get("params", {}) or {}, f"{at}.params", set(kind.params))
    for req in kind.required:
        if req not in params:
            raise ctx.fail(f"{at}.params.{req}", f"required for {kind_name}")
    for key, value in params.items():
        allowed = kind.params[key]
        if isinstance(allowed, tuple) and allowed and not isinstance(allowed[0], type):
            if value not in allowed:
                raise ctx.fail(f"{at}.params.{key}",
                               f"one of {', '.join(map(str, allowed))} (got {value!r})")
        elif not isinstance(value, allowed) or isinstance(value, bool):
            raise ctx.fail(f"{at}.params.{key}", f"wrong type (got {value!r})")
    _fault_rules(ctx, kind_name, params)
    return Fault(kind=kind_name, rank=rank, node=node, params=dict(params))


def _fault_rules(ctx: _Ctx, kind: str, params: Mapping[str, Any]) -> None:
    """Cross-field rules: each mode needs its own numbers."""
    needs: dict[tuple[str, str], tuple[str, ...]] = {
        ("slowdown", "cgroup"): ("cpu_pct",), ("slowdown", "sigstop_duty"): ("stop_ms", "run_ms"),
        ("link", "latency"): ("latency_ms",), ("link", "loss"): ("loss_pct",),
        ("link", "throttle"): ("rate",), ("link", "flap"): ("flaps",),
    }
    mode = params.get("method", params.get("mode"))
    for req in needs.get((kind, str(mode)), ()):
        if req not in params:
            raise ctx.fail(f"fault.params.{req}", f"required for {kind} {mode}")
    if kind == "link" and "loss_pct" in params and not 0 < params["loss_pct"] <= 100:
        raise ctx.fail("fault.params.loss_pct", f"1..100 (got {params['loss_pct']})")
    if "cpu_pct" in params and params["cpu_pct"] <= 0:
        raise ctx.fail("fault.params.cpu_pct", f"must be > 0 (got {params['cpu_pct']})")


def _expect(ctx: _Ctx, doc: Any) -> Expect:
    e = ctx.mapping(doc, "expect", {"verdicts", "actions", "resumed", "incident",
                                     "checkpoint_corrupt", "tolerate"})
    incident = e.get("incident", "recovered")
    if incident not in INCIDENT_ENDS:
        raise ctx.fail("expect.incident", f"one of {', '.join(INCIDENT_ENDS)} "
                       f"(got {incident!r})")
    for flag in ("resumed", "checkpoint_corrupt"):
        if flag in e and not isinstance(e[flag], bool):
            raise ctx.fail(f"expect.{flag}", f"true or false (got {e[flag]!r})")
    actions = ctx.strings(e.get("actions", []), "expect.actions")
    known = tuple(a.value for a in CommandAction)
    for i, a in enumerate(actions):
        if a not in known:
            raise ctx.fail(f"expect.actions[{i}]", f"one of {', '.join(known)} (got {a!r})")
    return Expect(verdicts=_kinds(ctx, e.get("verdicts", []), "expect.verdicts"),
                  actions=actions, resumed=bool(e.get("resumed", True)), incident=incident,
                  checkpoint_corrupt=bool(e.get("checkpoint_corrupt", False)),
                  tolerate=_kinds(ctx, e.get("tolerate", []), "expect.tolerate"))


def _kinds(ctx: _Ctx, value: Any, field_name: str) -> tuple[VerdictKind, ...]:
    names = ctx.strings(value, field_name)
    known = {k.value for k in VerdictKind}
    for i, name in enumerate(names):
        if name not in known:
            raise ctx.fail(f"{field_name}[{i}]", f"a verdict kind, one of "
                           f"{', '.join(sorted(known))} (got {name!r})")
    return tuple(VerdictKind(n) for n in names)


def _stops(ctx: _Ctx, doc: Any) -> tuple[StopCondition, ...]:
    if not isinstance(doc, list) or not doc:
        raise ctx.fail("stop_conditions", "a non-empty list (when to abort the drill)")
    out = []
    for i, item in enumerate(doc):
        here = f"stop_conditions[{i}]"
        s = ctx.mapping(item, here, {"kind", "value"})
        if s.get("kind") not in STOP_KINDS:
            raise ctx.fail(f"{here}.kind", f"one of {', '.join(STOP_KINDS)} "
                           f"(got {s.get('kind')!r})")
        integer = STOP_KINDS[s["kind"]] is int
        out.append(StopCondition(s["kind"], ctx.number(s.get("value"), f"{here}.value",
                                                       minimum=0, integer=integer)))
    return tuple(out)


def _rollback(ctx: _Ctx, doc: Any, kind: str) -> Rollback:
    r = ctx.mapping(doc, "rollback", {"action", "when"})
    allowed = FAULT_KINDS[kind].rollbacks
    if r.get("action") not in allowed:
        raise ctx.fail("rollback.action", f"for {kind}: one of {', '.join(allowed)} "
                       f"(got {r.get('action')!r})")
    when = ctx.strings(r.get("when", list(ROLLBACK_WHEN)), "rollback.when")
    for i, w in enumerate(when):
        if w not in ROLLBACK_WHEN:
            raise ctx.fail(f"rollback.when[{i}]", f"one of {', '.join(ROLLBACK_WHEN)}")
    return Rollback(action=r["action"], when=when)


def _pre(ctx: _Ctx, doc: Any) -> Preconditions:
    p = ctx.mapping(doc, "preconditions", {"steady_steps", "checkpoints", "spares"})
    vals = {k: int(ctx.number(v, f"preconditions.{k}", integer=True)) for k, v in p.items()}
    return Preconditions(**vals)


def _observe(ctx: _Ctx, doc: Any) -> Observe:
    o = ctx.mapping(doc, "observe", {"settle_steps", "timeout_s", "before_s"})
    settle = int(ctx.number(o.get("settle_steps", 10), "observe.settle_steps", minimum=1,
                            integer=True))
    return Observe(settle_steps=settle,
                   timeout_s=ctx.number(o.get("timeout_s", 180.0), "observe.timeout_s",
                                        minimum=1),
                   before_s=ctx.number(o.get("before_s", 5.0), "observe.before_s"))


def _tolerance(ctx: _Ctx, doc: Any) -> Tolerance:
    t = ctx.mapping(doc, "tolerance", {"loss_abs"})
    return Tolerance(loss_abs=ctx.number(t.get("loss_abs", 1e-3), "tolerance.loss_abs"))


def load_scenario(path: Path) -> Scenario:
    try:
        doc = load_yaml(path)
    except ConfigFileError as exc:
        raise ScenarioError(str(path), "?", "<file>", exc.reason) from None
    return parse_scenario(doc, str(path))


def builtin_dir() -> Path:
    return Path(str(resources.files("trainguard.drills") / "scenarios"))


def builtin_scenarios() -> list[Scenario]:
    """Every scenario shipped with trainguard, by round then name; names are unique."""
    out = [load_scenario(p) for p in sorted(builtin_dir().glob("*.yaml"))]
    seen: dict[str, str] = {}
    for s in out:
        if s.name in seen:
            raise ScenarioError(s.source, s.name, "name", f"also used by {seen[s.name]}")
        seen[s.name] = s.source
    return sorted(out, key=lambda s: (s.round, s.name))


def resolve(names_or_paths: list[str]) -> list[Scenario]:
    """Scenarios by built-in name, file path, or ``round:N`` / ``all``."""
    builtin = builtin_scenarios()
    by_name = {s.name: s for s in builtin}
    out: list[Scenario] = []
    for item in names_or_paths:
        if item == "all":
            out.extend(builtin)
        elif item.startswith("round:"):
            n = item.split(":", 1)[1]
            picked = [s for s in builtin if str(s.round) == n]
            if not picked:
                raise ScenarioError("<args>", item, "round", f"no built-in scenario in {n!r}")
            out.extend(picked)
        elif item in by_name:
            out.append(by_name[item])
        elif Path(item).is_file():
            out.append(load_scenario(Path(item)))
        else:
            raise ScenarioError("<args>", item, "name",
                                f"not a built-in scenario ({', '.join(by_name)}) nor a file")
    return _once(out)


def _once(scenarios: list[Scenario]) -> list[Scenario]:
    """Each scenario once (``all r1-hang`` names r1-hang twice): a run keeps one directory per
    scenario name, so a second run of it would overwrite the first's evidence. Two different
    scenarios under one name cannot both run."""
    out: dict[str, Scenario] = {}
    for sc in scenarios:
        seen = out.setdefault(sc.name, sc)
        if seen != sc:
            raise ScenarioError("<args>", sc.name, "name",
                                "two different scenarios have this name; a run holds one")
    return list(out.values())
