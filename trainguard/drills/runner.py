"""Running scenarios on the whole local loop, for real.

For each scenario: a loop-mounted ext4 for its checkpoints, the job spec, the actuator (which
launches the job), a census of the rank processes and a follower of the log; wait for the
preconditions; freeze the baseline archives; inject (an ``injection`` event per act); hold for
the duration, then roll back; observe until the job is stable again (or a stop condition holds:
abort and roll back); stop the job; verify the checkpoint directory; record the job's log.
After every scenario, one fault-free baseline run of the same job (as many steps as the drills
reached) gives the losses to compare with; then each scenario is evaluated and reported.

Layout of a run directory (``$TRAINGUARD_STATE/drills/<run id>/``)::

    run.json                          which scenarios, when, the job, the conclusions
    baseline.json                     the baseline run's losses (per rank and step)
    <scenario>/archive.json           the five archives + window + artifacts + abort reason
    <scenario>/events.jsonl           the job's recorded log (every event, validated)
    <scenario>/evaluation.json        checks, expectations, timings, conclusion
    <scenario>/report.md|html         written by `trainguard drill report`
    <scenario>/logs, ranks, progress  service and rank output
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainguard.dev.kafka import KafkaBroker
from trainguard.dev.paths import state_dir
from trainguard.drills.baseline import code_version, freeze, load_or_run_baseline, runtime
from trainguard.drills.cluster import ClusterJob, ClusterSite
from trainguard.drills.evidence import EvidenceInput, evaluate
from trainguard.drills.evidence.evaluate import Evaluation
from trainguard.drills.evidence.model import Artifacts, Baseline
from trainguard.drills.injectors.base import Acted, FollowsTrigger, InjectionError, Injector
from trainguard.drills.injectors.build import Target, build
from trainguard.drills.injectors.storage import LoopFs
from trainguard.drills.job import NODE_LABEL, DrillJob
from trainguard.drills.live import stable, steady, stop_reason, view
from trainguard.drills.logtail import LogTail, publish, read_job_log, write_jsonl
from trainguard.drills.observe import Census, collect_settled
from trainguard.drills.scenario import FAULT_KINDS, NODE_LOST, Fault, Scenario
from trainguard.drills.stack import LocalStack
from trainguard.events.clock import now_us
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import new_event_id
from trainguard.events.payloads import Injection
from trainguard.netlab import VethLab

Say = Callable[[str], None]
SOURCE = "trainguard-drill"
# Link faults act on the veth between the drill's namespaces, where the ranks then run; a
# Toxiproxy latency cannot sit inside gloo's full mesh, so it is checked at the injector level.
def not_injectable(s: Scenario) -> str | None:
    if s.fault.kind == "link" and s.fault.params.get("mode") == "latency":
        return ("Toxiproxy latency/jitter needs a TCP proxy on the path; gloo's full mesh of "
                "rank-to-rank connections cannot be proxied, so this scenario is verified at "
                "the injector level only (tests/drill/test_injectors.py); link loss, "
                "throttle and down/flap run on the job's own path")
    return None


class Aborted(RuntimeError):
    pass


def runs_root() -> Path:
    return state_dir() / "drills"


@dataclass
class Recorder:
    """The drill's own events: published to the log (retried while the broker is away) and
    kept in ``injections.jsonl``."""

    stack: LocalStack
    job_id: str
    drill_id: str
    scenario: str
    path: Path
    pending: list[Event] = field(default_factory=list)
    sent: list[Event] = field(default_factory=list)

    def note(self, fault: Fault, phase: str, acted: Acted, extra: dict[str, Any] | None = None
             ) -> Event:
        params = dict(acted.params)
        params.update(extra or {})
        event = make_event(
            Injection(drill_id=self.drill_id, scenario=self.scenario, fault=fault.kind,
                      phase=phase,
                      target=fault.target, params=params),
            event_id=new_event_id(), job_id=self.job_id, event_time=acted.at_us,
            source=SOURCE, subject=Subject(rank=fault.rank, node=self.stack.node))
        with open(self.path, "ab") as fh:
            fh.write(event.model_dump_json(exclude_none=True).encode() + b"\n")
        self.pending.append(event)
        self.flush()
        return event

    def flush(self, timeout_s: float = 8.0) -> bool:
        if not self.pending:
            return True
        if self.stack.broker.running() is None:
            return False
        if publish(self.stack.config(), self.pending, timeout_s):
            self.sent += self.pending
            self.pending = []
            return True
        return False


@dataclass
class ScenarioRun:
    scenario: Scenario
    job_id: str
    dir: Path
    abort: str | None = None
    max_step: int = 0
    archive: dict[str, Any] = field(default_factory=dict)


class Progress:
    """One line per scenario phase; on a terminal, a bar redrawn in place."""

    def __init__(self, say: Say, total_s: float) -> None:
        self.say, self.total_s = say, total_s
        self.t0 = time.monotonic()
        self.tty = sys.stdout.isatty()
        self.last: tuple[str, str] = ("", "")
        self.said = 0.0

    def show(self, name: str, phase: str, detail: str) -> None:
        el = time.monotonic() - self.t0
        frac = min(1.0, el / self.total_s)
        bar = "#" * int(frac * 20) + "." * (20 - int(frac * 20))
        line = f"[{name}] [{bar}] {el:5.0f}s {phase}: {detail}"
        if self.tty:
            sys.stdout.write("\r" + line[:150].ljust(150))
            sys.stdout.flush()
        elif phase != self.last[0] or time.monotonic() - self.said > 15:
            self.say(line)
            self.said = time.monotonic()
        self.last = (phase, detail[:20])

    def done(self) -> None:
        if self.tty:
            sys.stdout.write("\n")


# Once stable, a fixed grace: records in flight (the outcome of the last command, the
# incident's closing transition) land before the settled-log wait starts counting quiet.
LAST_EVENTS_GRACE_S = 6.0
INCIDENTS_QUIET_S = 4.0  # twice the stack's incident idle flush (2 s)
INCIDENTS_SETTLE_MAX_S = 45.0
JOB_END_WAIT_S = 10.0  # scancel of the allocation -> the actuator's job.ended (it asks every 1 s)


def settled_log(read: Callable[[], list[Event]], quiet_s: float = INCIDENTS_QUIET_S,
                limit_s: float = INCIDENTS_SETTLE_MAX_S,
                clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> list[Event]:
    """The job's log once the incident service has decided its tail. It releases the last
    records of a window only after its idle flush, and folds late ones in after that: read
    right at the teardown, the log can hold an incident's opening without its end (the
    2026-12-03 broker-outage drill did). ``read`` (the drill's live tail, in memory) is read
    again every second until no incident transition has come for ``quiet_s`` (at most
    ``limit_s``)."""
    start = clock()
    events = read()
    seen = sum(e.type == "incident.transition" for e in events)
    quiet_since = clock()
    while clock() - quiet_since < quiet_s and clock() - start < limit_s:
        sleep(1.0)
        events = read()
        now = sum(e.type == "incident.transition" for e in events)
        if now != seen:
            seen, quiet_since = now, clock()
    return events


LOOK_MIN_S = 0.25  # looks at the log at most this often (each reads the whole job's view)
LOOK_MAX_S = 1.0  # and at least this often: time-based stop conditions, crashed services


class Looks:
    """When the runner looks at the loop again: as soon as the tail brings events (at most
    every ``LOOK_MIN_S``: a look recomputes the job's view from every event), and after
    ``LOOK_MAX_S`` without any (a stop condition on time, a service to revive)."""

    def __init__(self, tail: LogTail) -> None:
        self.tail = tail
        self.seen = 0
        self.last = time.monotonic()

    def next(self, until: float | None = None) -> None:
        """Returns at the next look (never after ``until``, a ``time.monotonic()``)."""
        cap = LOOK_MAX_S if until is None else max(0.0, min(LOOK_MAX_S,
                                                           until - time.monotonic()))
        rest = self.last + LOOK_MIN_S - time.monotonic()
        if rest > 0:
            time.sleep(min(rest, cap))
        left = cap - max(0.0, rest)
        if left > 0:
            self.seen = self.tail.wait_for_news(self.seen, left)
        self.last = time.monotonic()


def _wait(seconds: float, tick: Callable[[], None], looks: Looks) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tick()
        looks.next(until=end)


@dataclass
class _Live:
    """What one scenario's run holds while it runs, shared by its phases."""

    stack: LocalStack
    scenario: Scenario
    job: DrillJob
    res: ScenarioRun
    bar: Progress
    ckpt: Path
    fs: LoopFs | None  # None on the cluster: its shared directory (``_checkpoint_root``)
    mountpoint: Path
    lab: VethLab | None
    census: Census
    tail: LogTail
    rec: Recorder
    injectors: list[tuple[Fault, Injector]] = field(default_factory=list)
    undone: bool = False
    base_epoch: int | None = None
    fault_us: int = 0
    window_open: int | None = None
    last_progress: tuple[int, int] = (0, 0)  # (when, max step) of the last progress seen
    site: ClusterSite | None = None  # the Slurm cluster the job runs on (stack: slurm)


def run_one(stack: LocalStack, scenario: Scenario, job: DrillJob, run_dir: Path,
            run_id: str, say: Say, signer: str, site: ClusterSite | None = None
            ) -> ScenarioRun:
    """One scenario, in phases: set up (a context-manager stack whose unwinding is the
    teardown), start and freeze, inject, observe until stable, close the window; then record.
    A stop condition or a failed injection aborts (and rolls back); the teardown always runs."""
    job_id = f"{scenario.name}-{run_id}"
    sdir = run_dir / scenario.name
    sdir.mkdir(parents=True, exist_ok=True)
    res = ScenarioRun(scenario, job_id, sdir)
    if Path(scenario.source).is_file():  # the scenario as run: verify and report read this
        (sdir / "scenario.yaml").write_text(Path(scenario.source).read_text())
    artifacts: Artifacts | None = None
    window_close = 0
    with contextlib.ExitStack() as teardown:
        live, spec_text = _set_up(teardown, stack, scenario, job, res, run_id, say, site)
        try:
            _start_and_freeze(live, run_id, spec_text, signer)
            _inject(live, run_id)
            _observe(live)
        except (Aborted, InjectionError) as exc:
            res.abort = f"{type(exc).__name__}: {exc}"
            live.bar.show(scenario.name, "aborted", str(exc))
        finally:
            artifacts = _close_window(live)
            window_close = now_us()  # the teardown below is not part of the drill
            _stop_everything(live)
        # The context stack unwinds here: census, settled log, tail, recorder, lab, file system.
    res.archive.setdefault("run_id", run_id)
    res.archive["window"] = {"opened_us": live.window_open, "closed_us": window_close}
    res.archive["artifacts"] = artifacts.to_dict() if artifacts else None
    res.archive["abort"] = res.abort
    res.archive["unsent_injections"] = len(live.rec.pending)
    return _record(stack, res)


def _checkpoint_root(teardown: contextlib.ExitStack, sdir: Path, job_id: str,
                     site: ClusterSite | None) -> tuple[LoopFs | None, Path]:
    """Where the job's checkpoints go: a loop-mounted ext4 of the scenario's own (the storage
    faults act on it), or on the cluster a plain directory of its shared one. ``slurmd`` runs
    under ``ip netns exec``, which gives it a mount namespace of its own: a file system
    mounted after the cluster started is invisible to its steps, which would write to the
    directory underneath. Returns (the loop fs or None, its mount point or the directory)."""
    if site is not None:
        root = Path(site.require().shared_dir) / "drills" / job_id
        root.mkdir(parents=True)
        teardown.callback(shutil.rmtree, root, True)
        return None, root
    fs = teardown.enter_context(LoopFs(sdir / "ckpt.img", sdir / "ckpt"))
    return fs, fs.mountpoint


def _set_up(teardown: contextlib.ExitStack, stack: LocalStack, scenario: Scenario,
            job: DrillJob, res: ScenarioRun, run_id: str, say: Say,
            site: ClusterSite | None = None) -> tuple[_Live, str]:
    """The scenario's file system, lab, job spec and watchers, each registered for teardown in
    the order it must be undone (last registered, first undone)."""
    sdir = res.dir
    bar = Progress(say, scenario.observe.timeout_s + scenario.duration_s + 90)
    teardown.callback(bar.done)
    lab = _lab(scenario, job, sdir)
    fs, mountpoint = _checkpoint_root(teardown, sdir, res.job_id, site)
    if lab is not None:
        teardown.enter_context(lab)
    ckpt = mountpoint / "job"
    ckpt.mkdir()
    spec_text = job.write_spec(sdir / "job.yaml", job_id=res.job_id, ckpt_dir=ckpt,
                               run_dir=sdir, node=stack.node, agent_socket=stack.agent_socket,
                               netns=(sdir / "netns.json", lab.addr_a) if lab else None)
    rec = Recorder(stack, res.job_id, run_id, scenario.name, sdir / "injections.jsonl")
    teardown.callback(rec.flush, 30)
    tail = LogTail(stack.config("trainguard-drill-tail"), res.job_id)
    tail.start()
    teardown.callback(tail.stop)
    # Before the tail stops: the incident service has decided the window's tail.
    teardown.callback(settled_log, tail.events)
    census = Census(res.job_id)
    census.start()
    teardown.callback(census.stop)
    live = _Live(stack=stack, scenario=scenario, job=job, res=res, bar=bar, ckpt=ckpt, fs=fs,
                 mountpoint=mountpoint, lab=lab, census=census, tail=tail, rec=rec, site=site)
    return live, spec_text


def _start_and_freeze(live: _Live, run_id: str, spec_text: str, signer: str) -> None:
    """The actuator launches the job; once the preconditions hold, the archives are frozen."""
    scenario, res = live.scenario, live.res
    live.stack.start_actuator(res.job_id, res.dir / "job.yaml", launch=True,
                              extra=live.job.actuator_args(), env=live.job.actuator_env())
    _preconditions(scenario, live.job, live.tail, live.bar)
    res.archive = freeze(run_id=run_id, scenario=scenario, job=live.job, job_id=res.job_id,
                         spec_text=spec_text, ckpt_dir=live.ckpt, events=live.tail.events(),
                         signer=signer, code=code_version(), rt=runtime())
    live.base_epoch = view(live.tail.events()).epoch
    live.window_open = now_us() - int(scenario.observe.before_s * 1e6)


def _inject(live: _Live, run_id: str) -> None:
    """The fault (and its trigger), each an ``injection`` event."""
    scenario = live.scenario
    target = Target(pids=live.census.pids, node_ranks=_node_ranks(live.job), ckpt_root=live.ckpt,
                    mountpoint=live.mountpoint, image=live.fs.image if live.fs else None,
                    broker=live.stack.broker, tag=run_id, lab=live.lab,
                    cluster_nodes=live.site.node_veth() if live.site else None)
    inj = build(scenario.fault, target, scenario.rollback.action)
    acted = inj.inject()
    live.injectors.append((scenario.fault, inj))
    live.rec.note(scenario.fault, "start", acted)
    live.fault_us = acted.at_us
    live.bar.show(scenario.name, "injected", f"{scenario.fault.kind} {acted.params}")
    if scenario.trigger is not None:
        trig = build(scenario.trigger, target)
        live.rec.note(scenario.trigger, "start", trig.inject(),
                      {"trigger_for": scenario.fault.kind})
        live.injectors.append((scenario.trigger, trig))
        if isinstance(inj, FollowsTrigger):
            for again in inj.after_trigger():
                live.rec.note(scenario.fault, "start", again, {"after_trigger": True})
    live.last_progress = (now_us(), 0)


def _check(live: _Live) -> None:
    """One look at the loop while observing: revive crashed services, note progress, abort on
    a stop condition."""
    scenario = live.scenario
    for name in live.stack.revive():
        live.res.archive.setdefault("services_revived", []).append(
            {"service": name, "at_us": now_us()})
    v = view(live.tail.events(), base_epoch=live.base_epoch)
    if v.max_step > live.last_progress[1]:
        live.last_progress = (now_us(), v.max_step)
    reason = stop_reason(scenario.stop_conditions, v, now_us=now_us(), fault_us=live.fault_us,
                         last_progress_us=live.last_progress[0],
                         max_live=live.census.max_live)
    if reason:
        raise Aborted(reason)
    live.bar.show(scenario.name, "observing", f"epoch {v.epoch} step {v.max_step} "
                  f"restarts {v.epochs_after}")


def _observe(live: _Live) -> None:
    """Hold the fault for its duration, roll it back, then wait until the job is stable."""
    scenario = live.scenario
    looks = Looks(live.tail)
    _wait(scenario.duration_s, lambda: _check(live), looks)
    if scenario.duration_s > 0:
        _undo(live.injectors, live.rec, "stop")
        live.undone = True
    fault_end = now_us()
    deadline = time.monotonic() + scenario.observe.timeout_s
    while True:
        _check(live)
        if stable(view(live.tail.events(), since_us=fault_end), live.job.world,
                  scenario.observe.settle_steps):
            break
        if time.monotonic() > deadline:
            raise Aborted(f"timeout: not stable {scenario.observe.timeout_s:g} s "
                          "after the fault")
        looks.next()
    live.bar.show(scenario.name, "stable", "letting the last events land")
    time.sleep(LAST_EVENTS_GRACE_S)


def _close_window(live: _Live) -> Artifacts | None:
    """Roll back what is still held (or everything, after an abort) and read the checkpoint
    directory as the window closes (the job may still be saving)."""
    res = live.res
    held = FAULT_KINDS[live.scenario.fault.kind].held
    if live.injectors and not live.undone and (held or res.abort):
        try:
            _undo(live.injectors, live.rec, "rollback" if res.abort else "stop")
        except InjectionError as exc:
            res.abort = (res.abort or "") + f"; rollback failed: {exc}"
    node = _fault_node(live.scenario.fault, live.job)
    if live.site is not None and isinstance(live.job, ClusterJob) and node is not None:
        # Slurm's own word on the faulty node's steps, before the drill stops anything
        facts = live.site.step_facts(
            live.stack.actuator_dir(res.job_id) / "logs" / "slurm-steps.journal", res.job_id,
            live.job.alloc, node)
        res.archive["slurm"] = facts.to_dict()
    try:
        return collect_settled(live.ckpt, live.census)
    except OSError as exc:
        res.abort = (res.abort or "") + f"; checkpoint directory unreadable: {exc}"
        return None


def _stop_everything(live: _Live) -> None:
    """The scenario's actuator, its job's ranks and their cgroups. On the Slurm cluster the
    job is ended as its user would end it, by cancelling the allocation, while the loop still
    runs: the actuator says ``job.ended`` and decide calls nobody about the ranks' exits."""
    if live.site is not None and isinstance(live.job, ClusterJob):
        _cancel_allocation(live.site, live.job.alloc, live.tail)
    live.stack.stop(f"actuator-{live.res.job_id}")
    _stop_job(live.census)
    _remove_cgroups(live.res.job_id)


def _cancel_allocation(site: ClusterSite, alloc: int, tail: LogTail,
                       timeout_s: float = JOB_END_WAIT_S) -> None:
    """``scancel`` the allocation and wait (a bounded while) for the actuator's ``job.ended``."""
    site.cancel(alloc)
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline:
        events = tail.events()
        if any(e.type == "job.ended" for e in events[seen:]):
            return
        seen = len(events)
        tail.wait_for_news(seen, max(0.0, deadline - time.monotonic()))


def _record(stack: LocalStack, res: ScenarioRun) -> ScenarioRun:
    """The job's log and the archive, on disk for verify and report."""
    events = read_job_log(stack.config("trainguard-drill-record"), res.job_id)
    write_jsonl(res.dir / "events.jsonl", events)
    res.max_step = max((getattr(e.payload, "step", 0) for e in events
                        if e.type == "step.report"), default=0)
    (res.dir / "archive.json").write_text(json.dumps(res.archive, indent=1, sort_keys=True))
    return res


def _lab(scenario: Scenario, job: DrillJob, sdir: Path) -> VethLab | None:
    """For a link scenario: two namespaces joined by veth, node-a's units in ``a``, node-b's
    in ``b``; the map the ranks' wrapper reads."""
    if scenario.fault.kind != "link":
        return None
    lab = VethLab(uuid.uuid4().hex[:6], gso_max_segs=1)
    mapping = {u["name"]: ([lab.a.name, lab.dev_a] if u["labels"][NODE_LABEL] == "node-a"
                           else [lab.b.name, lab.dev_b]) for u in job.units()}
    (sdir / "netns.json").write_text(json.dumps(mapping))
    return lab


def _undo(injectors: list[tuple[Fault, Injector]], rec: Recorder, phase: str) -> None:
    for fault, inj in reversed(injectors):
        rec.note(fault, phase, inj.undo())


def _node_ranks(job: DrillJob) -> Callable[[str], set[int]]:
    def ranks(node: str) -> set[int]:
        return {int(u["rank"]) for u in job.units()
                if u.get("rank") is not None and u["labels"][NODE_LABEL] == node}
    return ranks


def _preconditions(scenario: Scenario, job: DrillJob, tail: LogTail, bar: Progress,
                   timeout_s: float = 240.0) -> None:
    pre = scenario.preconditions
    deadline = time.monotonic() + timeout_s
    looks = Looks(tail)
    while True:
        missing = steady(view(tail.events()), job.world, pre.steady_steps, pre.checkpoints,
                         pre.spares)
        if missing is None:
            return
        if time.monotonic() > deadline:
            raise Aborted(f"preconditions not met in {timeout_s:.0f} s: {missing}")
        bar.show(scenario.name, "waiting for", missing)
        looks.next(until=deadline)


def _remove_cgroups(job_id: str) -> None:
    """The job's unit cgroups the actuator made (``trainguard/<job>-<unit>``), now empty."""
    from trainguard.actuators import cgroups

    try:
        root, _ = cgroups.cpu_controller()
    except cgroups.CgroupError:
        return
    for path in (root / "trainguard").glob(f"{job_id}-*"):
        try:
            path.rmdir()
        except OSError:
            pass


def _stop_job(census: Census) -> None:
    """The job's rank processes (found by the census: started by this drill's actuator)."""
    for _ in range(3):
        pids = census.pids()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(1.0)
        census.sample()


def recorded_scenario(sdir: Path, name: str, source: str) -> Scenario:
    """The scenario as it was run (its copy in the run), else its source, else the built-in."""
    from trainguard.drills.scenario import load_scenario, resolve

    for path in (sdir / "scenario.yaml", Path(source)):
        if path.is_file():
            return load_scenario(path)
    return resolve([name])[0]


def recorded_events(sdir: Path, archive: dict[str, Any]) -> list[Event]:
    """The scenario's recorded log up to the end of its observation window (the drill's own
    teardown, stopping the job, comes after and is not evidence)."""
    from trainguard.drills.logtail import read_jsonl

    close = (archive.get("window") or {}).get("closed_us")
    return [e for e in read_jsonl(sdir / "events.jsonl")
            if close is None or e.event_time <= close]


def evaluate_run(sdir: Path, scenario: Scenario, baseline: Baseline | None) -> Evaluation:
    """The evaluation of one recorded scenario from its files alone (used by verify too)."""
    archive = json.loads((sdir / "archive.json").read_text())
    events = recorded_events(sdir, archive)
    art = archive.get("artifacts")
    job_id = archive.get("task", {}).get("job_id") or f"{scenario.name}-{archive['run_id']}"
    return evaluate(EvidenceInput(job_id=job_id, events=events, expect=scenario.expect,
                                  loss_tolerance=scenario.tolerance.loss_abs,
                                  settle_steps=scenario.observe.settle_steps,
                                  baseline=baseline,
                                  artifacts=Artifacts.from_dict(art) if art else None,
                                  lost_node=scenario.fault.node
                                  if scenario.fault.kind in NODE_LOST
                                  else None, slurm=archive.get("slurm")))


def _fault_node(fault: Fault, job: DrillJob) -> str | None:
    """The node a fault acts on: the one it names, or on the cluster the node its rank ran
    on when the job started (one rank per node)."""
    if fault.node is not None:
        return fault.node
    if isinstance(job, ClusterJob) and fault.rank is not None and fault.rank < len(job.nodes):
        return job.nodes[fault.rank]
    return None


def run_drills(scenarios: Sequence[Scenario], *, job: DrillJob | None = None,
               root: Path | None = None, say: Say = print, signer: str = "unsigned",
               run_id: str | None = None) -> Path:
    """Run the scenarios on one local stack; returns the run directory."""
    job = job or DrillJob()
    run_id = run_id or time.strftime("%Y%m%d%H%M%S") + uuid.uuid4().hex[:4]
    run_dir = (root or runs_root()) / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"run_id": run_id, "started_at": now_us(), "job": job.to_dict(),
                            "scenarios": {}, "code_version": code_version()}
    runnable = [s for s in scenarios if not_injectable(s) is None]
    for s in scenarios:
        why = not_injectable(s)
        if why is not None:
            meta["scenarios"][s.name] = {"conclusion": None, "not_run": why,
                                         "source": s.source}
    results: list[ScenarioRun] = []
    if {s.stack for s in runnable} == {"local", "slurm"}:
        # one stack per run (and one baseline job): the cluster's scenarios are run alone
        for s in runnable:
            if s.stack == "slurm":
                meta["scenarios"][s.name] = {
                    "conclusion": None, "source": s.source,
                    "not_run": "runs on the Slurm cluster: run it alone "
                               f"(trainguard drill run {s.name})"}
        runnable = [s for s in runnable if s.stack == "local"]
    if runnable and runnable[0].stack == "slurm":
        job = _run_on_cluster(runnable, job, run_dir, run_id, say, signer, meta, results)
    elif runnable:
        # the drills' own broker: an outage drill must never stop anybody else's
        broker = KafkaBroker(runs_root() / "kafka")
        with LocalStack(run_dir / "stack", prefix=f"drill{run_id}", say=say,
                        broker=broker) as stack:
            stack.start_services()
            try:
                for s in runnable:
                    stack.revive()
                    say(f"[drill] {s.name} (round {s.round}): {s.title}")
                    results.append(run_one(stack, s, job, run_dir, run_id, say, signer))
            except KeyboardInterrupt:
                say("[drill] interrupted: evaluating the scenarios that ran")
                meta["interrupted"] = True
            meta["services_revived"] = [{"service": n, "exit": c} for n, c in stack.revived]
    finalize(run_dir, results, meta, job, say)
    return run_dir


def _run_on_cluster(scenarios: Sequence[Scenario], job: DrillJob, run_dir: Path, run_id: str,
                    say: Say, signer: str, meta: dict[str, Any],
                    results: list[ScenarioRun]) -> DrillJob:
    """The scenarios on the dev Slurm cluster: its broker is the drill's, its nodes' agents
    publish there; one allocation per scenario, every node back in service after each.
    Returns the job as run (the baseline runs the same)."""
    prefix = f"drill{run_id}"
    base = job if isinstance(job, ClusterJob) else None
    ran: DrillJob = job
    with ClusterSite(prefix, say) as site, LocalStack(
            run_dir / "stack", prefix=prefix, say=say, broker=site.broker) as stack:
        stack.start_services(("streams", "decide", "incidents"))
        try:
            for i, s in enumerate(scenarios):
                if i:
                    site.restore()  # the node an earlier scenario lost, back in service
                stack.revive()
                say(f"[drill] {s.name} (round {s.round}, on the Slurm cluster): {s.title}")
                with site.allocation() as alloc:
                    ran = site.job(base, alloc, s.launcher)
                    results.append(run_one(stack, s, ran, run_dir, run_id, say, signer, site))
        except KeyboardInterrupt:
            say("[drill] interrupted: evaluating the scenarios that ran")
            meta["interrupted"] = True
        meta["services_revived"] = [{"service": n, "exit": c} for n, c in stack.revived]
    meta["job"] = ran.to_dict()
    return ran


def finalize(run_dir: Path, results: Sequence[ScenarioRun], meta: dict[str, Any],
             job: DrillJob, say: Say) -> None:
    """The baseline run, then each recorded scenario's evaluation, then ``run.json``."""
    need = max((r.max_step for r in results), default=0) + 5
    baseline: Baseline | None = None
    if results:
        say(f"[drill] baseline: the same job, fault-free, {need} steps")
        try:
            baseline, bpath = load_or_run_baseline(job, runs_root() / "baselines", need)
            (run_dir / "baseline.json").write_text(bpath.read_text())
        except RuntimeError as exc:
            say(f"[drill] baseline failed: {exc}")
    for r in results:
        ev = evaluate_run(r.dir, r.scenario, baseline)
        (r.dir / "evaluation.json").write_text(json.dumps(ev.to_dict(), indent=1))
        meta["scenarios"][r.scenario.name] = {"conclusion": ev.conclusion.value,
                                              "abort": r.abort, "source": r.scenario.source,
                                              "job_id": r.job_id}
        say(f"[drill] {r.scenario.name}: {ev.conclusion.value}"
            + (f" (aborted: {r.abort})" if r.abort else ""))
    meta["finished_at"] = now_us()
    (run_dir / "run.json").write_text(json.dumps(meta, indent=1, sort_keys=True))


def finalize_recorded(run_dir: Path, job: DrillJob | None = None, say: Say = print) -> None:
    """Evaluate the scenarios a run recorded (``archive.json`` + ``events.jsonl``) when the
    run itself did not get to (interrupted): same baseline, same evaluation."""
    job = job or DrillJob()
    results = []
    for sdir in sorted(p for p in run_dir.iterdir() if (p / "events.jsonl").exists()
                       and (p / "archive.json").exists()):
        archive = json.loads((sdir / "archive.json").read_text())
        scen = recorded_scenario(sdir, sdir.name, archive.get("scenario", {}).get("source", ""))
        from trainguard.drills.logtail import read_jsonl
        steps = [getattr(e.payload, "step", 0) for e in read_jsonl(sdir / "events.jsonl")
                 if e.type == "step.report"]
        results.append(ScenarioRun(scen, archive.get("task", {}).get("job_id", ""), sdir,
                                   abort=archive.get("abort"), max_step=max(steps, default=0),
                                   archive=archive))
    meta: dict[str, Any] = {"run_id": run_dir.name, "job": job.to_dict(), "scenarios": {},
                            "code_version": code_version(), "finalized_after_interrupt": True}
    finalize(run_dir, results, meta, job, say)
