"""The demo: the whole loop on a real local PyTorch DDP job with injected faults.

1. the local stack as plain processes (``trainguard.drills.stack``): a real Kafka broker, the
   node agent, the streams worker (rules), the decision service, the incident service, the
   alerts service posting to a local chat receiver, and an actuator that launches the job —
   4 DDP ranks (gloo) on units of this machine, with 1 spare unit in the pool;
2. once the job has written checkpoints: rank 3 is killed with SIGKILL → process_exit verdict →
   a signed migrate command → the old replicas fenced, rank 3 bound to the spare, every rank
   resumed from the last valid checkpoint at the next epoch;
3. then rank 1's unit is throttled to 2% of a core through its cgroup → straggler verdict →
   tier 1 raises the unit's quota → the rank catches up and the verdict resolves;
4. each injection is an ``injection`` event; at the end the incidents are read back from the
   log (`trainguard incident list/show`, the four questions answered), the replay check
   reproduces them, and the chat receiver's messages are counted.

Everything it writes stays under ``.run/demo/<time>/`` (logs, checkpoints, the HTML timelines),
wherever the clone is: the job runs on this one node, so its checkpoints may live there even
under ``/tmp`` (``--allow-tmp-ckpt``). Ranks that cannot start end the demo at once with the
rank's own error line, not after the start-up wait. The job is ended with the node agent
already stopped: the exits of its ranks are the demo's doing, not a fault, and no incident is
left open by them (decide is stopped first for the same reason).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

from trainguard.actuators.jobspec import ddp_job_doc
from trainguard.dev.webhook_receiver import Route, WebhookReceiver, hmac_check, path_token_check
from trainguard.drills.injectors.base import Acted, InjectionError
from trainguard.drills.injectors.slowdown import CgroupThrottle
from trainguard.drills.live import view
from trainguard.drills.logtail import LogTail, publish, read_job_log
from trainguard.drills.stack import LocalStack
from trainguard.events.clock import now_us
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import new_event_id
from trainguard.events.payloads import (
    Command,
    CommandAction,
    CommandOutcome,
    IncidentState,
    IncidentTransition,
    Injection,
    OutcomeStatus,
    PoolUnit,
    UnitState,
    Verdict,
    VerdictKind,
    VerdictState,
)

JOB = "demo-job"
NODE = "demo-node"
WORLD = 4
# The drills' slowdown: the small model computes ~1 ms a step, which a 10 % quota barely
# touches; at 2 % the rank is throttled every step (a wider model only made the ranks' compute
# times noisier on 2 shared cores: 5-10 ms steps wander by a timeslice)
THROTTLE_PCT = 2
# steps every resumed rank makes before the slowdown (the rule's warm-up and normal: 10 + 10)
LEARN_STEPS = 30
Say = Callable[[str], None]


class DemoError(RuntimeError):
    pass


@dataclass
class DemoOutcome:
    run_dir: Path
    prefix: str
    injections: list[tuple[str, int]] = field(default_factory=list)
    incidents: dict[str, IncidentState] = field(default_factory=dict)
    ended_at: int = 0
    chat_messages: int = 0


def run_whole_loop(run_dir: Path, say: Say = print) -> DemoOutcome:
    run_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"demo{secrets.token_hex(3)}"
    out = DemoOutcome(run_dir, prefix)
    with LocalStack(run_dir, prefix=prefix, node=NODE, say=say) as stack, \
            _Chat() as (rx, chat_env):
        stack.start_services(("agent", "streams", "decide", "incidents"))
        stack.start_service("alerts", ["alerts", "run", "--config",
                                       str(_alerts_config(run_dir, rx)),
                                       "--from-offset", "earliest"], env=chat_env)
        spec = write_job_spec(stack, run_dir)
        tail = LogTail(stack.config("trainguard-demo"), JOB)
        tail.start()  # following the log before the ranks start: a failed start shows at once
        stack.start_actuator(JOB, spec, launch=True)
        try:
            _drive(stack, tail, out, say)
        except DemoError as exc:
            say(f"[demo] FAILED: {exc}")  # now, not after the teardown
            raise
        finally:
            tail.stop()
            say("[demo] ending the job (fenced and recorded on the log)")
            out.ended_at = now_us()
            end_job(stack, spec)
        _wait_for(lambda: settled(fault_incidents(stack, out.ended_at)), 60,
                  "the incident service to settle the faults' incidents")
        out.incidents = fault_incidents(stack, out.ended_at)
        left = open_incidents(stack)
        if left:
            say(f"[demo] still open: {', '.join(i[:12] for i in left)}")
        _wait_for(lambda: len(rx.records()) >= 2 * len(out.incidents), 30,
                  "an opening and an ending message per incident")
        out.chat_messages = len(rx.records())
        _present(stack, run_dir, out, say)
    return out


def write_job_spec(stack: LocalStack, run_dir: Path, world: int = WORLD) -> Path:
    """The demo job's spec, written to ``run_dir/job.yaml``: ``world`` ranks and one spare
    unit on this node, checkpoints every 10 steps under the run dir (allowed under /tmp: the
    demo's job lives on this one machine)."""
    spec = run_dir / "job.yaml"
    doc = ddp_job_doc(JOB, world_size=world, spares=1, ckpt_dir=run_dir / "ckpt",
                      node=NODE, agent_socket=stack.agent_socket,
                      progress_dir=run_dir / "progress", ckpt_every=10, step_ms=100.0,
                      log_dir=run_dir / "ranks", allow_tmp_ckpt=True)
    spec.write_text(yaml.safe_dump(doc, sort_keys=False))
    return spec


def end_job(stack: LocalStack, spec: Path) -> None:
    """End the job: its ranks stop for good and their units are fenced, on the log.

    decide goes first (the job's end is no fault to remediate), then the node agent (the
    ranks' exits are the demo's doing: seen, they would open a ``process_exit`` incident that
    nothing resolves), then the actuator, whose ``--teardown`` stops every replica."""
    stack.stop("decide")
    stack.stop("agent")
    stack.stop(f"actuator-{JOB}")
    subprocess.run(stack.cli("actuator", "--job-spec", str(spec), "--state-dir",
                             str(stack.root / f"actuator-{JOB}"),
                             *stack.actuator_key_args(), "--teardown"),
                   check=False, timeout=120, stdout=subprocess.DEVNULL)


def wait_for_start(stack: LocalStack, tail: LogTail, log_dir: Path, limit_s: float = 300,
                   world: int = WORLD) -> None:
    """Until every rank steps and 2 checkpoints are written; a rank that exits first ends the
    wait at once (polled every 0.2 s), with the last line of its log (its own error)."""
    _wait_for(lambda: view(tail.events()).checkpoints >= 2
              and len(view(tail.events()).steps_at_epoch) == world, limit_s,
              "the job to start and checkpoint", stack,
              failed=lambda: start_failure(tail.events(), log_dir), poll_s=0.2)


def start_failure(events: list[Event], log_dir: Path,
                  alive: Callable[[int], bool] | None = None) -> str | None:
    """The first bound replica that is no longer running, with its log's last line; None
    while every replica the pool bound runs."""
    running = alive or _running
    bound: dict[int, tuple[int, int | None]] = {}
    for e in events:
        p = e.payload
        if isinstance(p, PoolUnit) and p.state is UnitState.BOUND and p.pid and \
                p.rank is not None:
            bound[p.rank] = (p.pid, p.epoch)
    for rank, (pid, epoch) in sorted(bound.items()):
        if not running(pid):
            line = last_line(log_dir / f"{JOB}-rank{rank}-e{epoch}.log")
            return f"rank {rank} (pid {pid}) exited before the job started: {line}"
    return None


def last_line(path: Path) -> str:
    """The last non-blank line of a log, or why there is none."""
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError as exc:
        return f"(no log: {exc})"
    return lines[-1].strip() if lines else f"(nothing in {path})"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _drive(stack: LocalStack, tail: LogTail, out: DemoOutcome, say: Say) -> None:
    say("[demo] waiting for the job: 4 ranks stepping, 2 checkpoints written")
    wait_for_start(stack, tail, out.run_dir / "ranks")
    # 1. worker exit
    base_epoch = kill_and_recover(stack, tail, out, say, rank=3)
    # The straggler rule learns each new replica's own normal over its first steps (warm-up,
    # then the normal): a slowdown that starts before that is judged only against its peers'
    # normals. A straggler appears mid-run: let the resumed ranks learn first.
    _wait_for(lambda: _resumed(tail.events(), base_epoch, min_steps=LEARN_STEPS), 120,
              f"{LEARN_STEPS} steps of every resumed rank", stack)
    # 2. slowdown, fixed by tier 1
    slow = _pid_of(tail.events(), rank=1)
    throttle = CgroupThrottle(slow, THROTTLE_PCT, tag="demo")
    try:
        acted = throttle.inject()
    except InjectionError as exc:
        say(f"[demo] slowdown not injected: {exc}")
        return
    _record(stack, out, acted, "slowdown", "start", 1, say,
            f"rank 1 (pid {slow}) throttled to {THROTTLE_PCT}% of a core (its unit's cgroup)")
    since = acted.at_us
    _wait_for(lambda: _quota_raised(tail.events(), since, rank=1), 120,
              "a straggler verdict on rank 1 and the tier-1 quota raise of its unit", stack)
    _wait_for(lambda: _straggler_resolved(tail.events(), since, rank=1), 90,
              "rank 1's straggler verdict to resolve", stack)
    _record(stack, out, throttle.undo(), "slowdown", "rollback", 1, say,
            "throttle rolled back")
    # Ending the job ends every rank's reports, so a verdict still open then never resolves.
    # On 2 shared cores a rank can run slow for real for a few seconds after such changes:
    # let the job run until no straggler verdict is open (or 45 s), then end it.
    deadline = time.monotonic() + 45
    time.sleep(3.0)
    while _open_stragglers(tail.events()) and time.monotonic() < deadline:
        time.sleep(1.0)


def kill_and_recover(stack: LocalStack, tail: LogTail, out: DemoOutcome, say: Say,
                     rank: int, world: int = WORLD) -> int | None:
    """Kill ``rank`` with SIGKILL (an injection event on the log), then wait until every rank
    steps at a later epoch: detected, fenced, migrated to the spare, resumed. The epoch the
    job had before the kill."""
    victim = _pid_of(tail.events(), rank=rank)
    base_epoch = view(tail.events()).epoch
    acted = Acted.now(pid=victim, signal=9)
    os.kill(victim, signal.SIGKILL)
    _record(stack, out, acted, "worker-exit", "start", rank, say,
            f"rank {rank} (pid {victim}) killed with SIGKILL")
    _wait_for(lambda: _resumed(tail.events(), base_epoch, world=world), 180,
              "detection, fencing, migration to the spare and resume", stack)
    say(f"[demo] resumed: every rank stepping at epoch {view(tail.events()).epoch}")
    return base_epoch


def _record(stack: LocalStack, out: DemoOutcome, acted: Acted, fault: str, phase: str,
            rank: int, say: Say, what: str) -> None:
    event = make_event(Injection(drill_id="demo", scenario="demo", fault=fault, phase=phase,
                                 target=f"rank-{rank}", params=acted.params),
                       event_id=new_event_id(), job_id=JOB, event_time=acted.at_us,
                       source="demo", subject=Subject(rank=rank, node=NODE))
    if not publish(stack.config("trainguard-demo"), [event]):
        raise DemoError("the broker did not take the injection event")
    out.injections.append((f"{fault}/{phase} rank {rank}", acted.at_us))
    say(f"[demo] injected: {what}")


def _pid_of(events: list[Event], rank: int) -> int:
    """The pid of the newest bound replica of ``rank`` (from the pool's events)."""
    for e in reversed(events):
        p = e.payload
        if isinstance(p, PoolUnit) and p.state is UnitState.BOUND and p.rank == rank and p.pid:
            return p.pid
    raise DemoError(f"no bound replica of rank {rank} on the log")


def _resumed(events: list[Event], base_epoch: int | None, min_steps: int = 3,
             world: int = WORLD) -> bool:
    v = view(events, base_epoch=base_epoch)
    return (v.epochs_after >= 1 and len(v.steps_at_epoch) == world
            and min(v.steps_at_epoch.values()) >= min_steps)


def _quota_raised(events: list[Event], since_us: int, rank: int) -> bool:
    raised = {e.payload.command_id for e in events if isinstance(e.payload, Command)
              and e.payload.action is CommandAction.RAISE_QUOTA and e.event_time >= since_us
              and e.payload.params.rank == rank}
    return any(isinstance(e.payload, CommandOutcome) and e.payload.command_id in raised
               and e.payload.status is OutcomeStatus.DONE for e in events)


def _straggler_resolved(events: list[Event], since_us: int, rank: int) -> bool:
    return any(isinstance(e.payload, Verdict) and e.payload.kind is VerdictKind.STRAGGLER
               and e.payload.state is VerdictState.RESOLVED and e.event_time >= since_us
               and e.subject.rank == rank for e in events)


def _open_stragglers(events: list[Event]) -> set[str]:
    state: dict[str, VerdictState] = {}
    for e in events:
        if isinstance(e.payload, Verdict) and e.payload.kind is VerdictKind.STRAGGLER:
            state[e.payload.verdict_id] = e.payload.state
    return {v for v, s in state.items() if s is VerdictState.OPEN}


ENDS = {s for s in IncidentState if not s.active}


def fault_incidents(stack: LocalStack, ended_at: int) -> dict[str, IncidentState]:
    """The latest state of each incident opened before the job was ended (the exits of the
    demo's own teardown open incidents of their own, left out here)."""
    opened: dict[str, int] = {}
    latest: dict[str, IncidentState] = {}
    for e in read_job_log(stack.config("trainguard-demo"), JOB, limit_s=30):
        if isinstance(e.payload, IncidentTransition):
            opened.setdefault(e.payload.incident_id, e.event_time)
            latest[e.payload.incident_id] = e.payload.to_state
    return {i: s for i, s in latest.items() if opened[i] < ended_at}


def open_incidents(stack: LocalStack) -> list[str]:
    """Incidents of the job whose latest state is not an end, whenever they opened."""
    latest: dict[str, IncidentState] = {}
    for e in read_job_log(stack.config("trainguard-demo"), JOB, limit_s=30):
        if isinstance(e.payload, IncidentTransition):
            latest[e.payload.incident_id] = e.payload.to_state
    return [i for i, s in latest.items() if s not in ENDS]


def settled(incidents: dict[str, IncidentState]) -> bool:
    return bool(incidents) and all(s in ENDS for s in incidents.values())


def _present(stack: LocalStack, run_dir: Path, out: DemoOutcome, say: Say) -> None:
    say(f"[demo] {len(out.incidents)} incident(s) from the faults: "
        + ", ".join(f"{i[:12]} {s.value}" for i, s in out.incidents.items()))
    say(_cli_text(stack, "incident", "list", "--job-id", JOB))
    for incident_id in out.incidents:
        say(_cli_text(stack, "incident", "show", incident_id))
        html = run_dir / f"incident-{incident_id[:12]}.html"
        _cli_text(stack, "incident", "show", incident_id, "--format", "html", "--out", str(html))
        say(f"[demo] timeline page: {html}")
    say(_cli_text(stack, "replay", "--job-id", JOB, *stack.trust_args()))
    say(f"[demo] chat receiver got {out.chat_messages} message(s) (an opening and an ending "
        "per incident, on each channel)")
    say(f"[demo] logs, checkpoints and pages under {run_dir}")


def _cli_text(stack: LocalStack, *args: str) -> str:
    done = subprocess.run(stack.cli(*args), capture_output=True, text=True, timeout=180,
                          check=False)
    return (done.stdout + done.stderr).rstrip()


def _wait_for(ok: Callable[[], bool], limit_s: float, what: str,
              stack: LocalStack | None = None,
              failed: Callable[[], str | None] | None = None, poll_s: float = 0.5) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if ok():
            return
        why = failed() if failed is not None else None
        if why is not None:
            raise DemoError(f"while waiting for {what}: {why}")
        if stack is not None and stack.dead():
            died = ", ".join(f"{s.name}:\n{s.tail()}" for s in stack.dead())
            raise DemoError(f"while waiting for {what}, a service died: {died}")
        time.sleep(poll_s)
    raise DemoError(f"gave up waiting {limit_s:.0f} s for {what}")


# --- the chat receiver: a local HTTP server standing in for Slack and a signed webhook -----

SLACK_TOKEN = "demo-slack-token"


class _Chat:
    def __init__(self) -> None:
        self.hook_secret = secrets.token_hex(16)
        self.rx = WebhookReceiver([
            Route("slack", "/slack/", check=path_token_check(SLACK_TOKEN), reply=b"ok"),
            Route("webhook", "/hook/", check=hmac_check(self.hook_secret)),
        ])

    def __enter__(self) -> tuple[WebhookReceiver, dict[str, str]]:
        self.rx.start()
        env = {"TG_DEMO_SLACK_URL": self.rx.url(f"/slack/services/T0/B0/{SLACK_TOKEN}"),
               "TG_DEMO_HOOK_SECRET": self.hook_secret}
        return self.rx, env

    def __exit__(self, *exc: object) -> None:
        self.rx.stop()


def _alerts_config(run_dir: Path, rx: WebhookReceiver) -> Path:
    path = run_dir / "alerts.yaml"
    path.write_text(
        "coalesce: {hold_s: 1}\nchannels:\n"
        "  - {name: slack, type: slack, url: {env: TG_DEMO_SLACK_URL}}\n"
        f"  - {{name: webhook, type: webhook, url: '{rx.url('/hook/demo')}', "
        "secret: {env: TG_DEMO_HOOK_SECRET}}\n")
    return path


def default_run_dir() -> Path:
    return Path.cwd() / ".run" / "demo" / time.strftime("%Y%m%dT%H%M%S")


if __name__ == "__main__":  # pragma: no cover - `trainguard demo` is the entry point
    run_whole_loop(default_run_dir())
    sys.exit(0)
