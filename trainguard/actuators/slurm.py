"""The ``slurm`` backend: replicas as job steps of one Slurm allocation, through Slurm's CLIs.

A unit is a Slurm node of the allocation (its spares included: the allocation is made with
``--no-kill`` over the job's nodes and its spares, so losing one node does not end it). A
replica is one step, ``srun --jobid=<alloc> -N1 -n1 -w <node> --overlap
--job-name=tg.<job>.r<rank>.e<epoch>``: on the node it runs inside the node's namespace (its
slurmd runs there), with ``TRAINGUARD_*`` in its environment. Slurm is read and driven only
through ``slurm_cli`` (sinfo, squeue, scontrol, scancel, srun), never its state files.

Proof and fencing (``slurm_steps``): the step is journalled before ``srun`` runs and again with
the step id Slurm lists; ``live`` is the journalled steps Slurm lists alive under that id and
name; ``fence`` cancels exactly the recorded step id (SIGTERM, SIGKILL after the job's grace)
and confirms it gone in ``scontrol show step``. A node Slurm sees lost (DOWN, not responding),
or one a command quarantined (a verdict blamed it) whose cancel cannot be confirmed, is set
DOWN (reason: the command) and powered off by the fence command (``power_off``; without one
the outcome says its processes may still run: behind a partition they do), then the step is
confirmed gone. A node Slurm finds responding that no verdict blamed is never powered off: an
unconfirmed cancel there is a ``FenceError``, and nothing is bound in its place.

Tier 1 has no per-step CPU quota on Slurm: the backend is not ``SetsQuota``, its units' events
say ``quota`` false and decide gives a straggler there tier 1's windows with no command before
tier 2 (a node-local cgroup through the node's agent would be the one way to build it; not
built). A save request is
``scancel --signal=USR1`` to the step; a spare is probed by a step on the node before it takes
a rank: the job's storage reached, and the node's agent answering on the job's agent socket.

The allocation is Slurm's to end (``scancel`` of it, its time limit): ``job_end`` reads its
final state from ``squeue``, and the actuator then says ``job.ended`` and restarts nothing.
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from trainguard_sdk.paths import ENV_SOCKET

from trainguard.actuators.backend import Released, Replica, StaleAction
from trainguard.actuators.fencing import FenceError
from trainguard.actuators.jobspec import JobSpec, UnitSpec
from trainguard.actuators.journal import Journal
from trainguard.actuators.local import SECRET_ENV
from trainguard.actuators.slurm_cli import SlurmCli, SlurmCliError
from trainguard.actuators.slurm_steps import (
    StepRecord,
    fence_start,
    find_step,
    latest,
    proven_live,
    reach_script,
    released,
    step_name,
    step_record_of,
)
from trainguard.actuators.slurm_view import (
    NodeHealth,
    SlurmNode,
    SlurmParseError,
    SlurmPool,
    pool,
    scheduler_end,
)
from trainguard.events.payloads import JobEnded, StopProof

log = logging.getLogger(__name__)
_SRUN_EXIT = re.compile(r"^srun: error: \S+: tasks? [\d,-]+: Exited with exit code \d+$")


class SlurmBackend:
    def __init__(self, cli: SlurmCli, alloc: int, log_dir: Path, *,
                 journal: Path | None = None, start_timeout_s: float = 30.0,
                 power_off: Sequence[str] | None = None) -> None:
        self.cli = cli
        self.power_off = tuple(power_off) if power_off else None  # argv, ``{node}`` replaced
        self.quarantined: set[str] = set()  # nodes drained by a command (until we restart)
        self.alloc = alloc
        self.log_dir = log_dir
        self.journal = Journal(journal or log_dir / "slurm-steps.journal")
        self.start_timeout_s = start_timeout_s
        self._sruns: dict[int, subprocess.Popen[bytes]] = {}

    # --- what the journal and Slurm prove -----------------------------------------------

    def records(self, job: JobSpec) -> dict[tuple[int, int], StepRecord]:
        recs = (step_record_of(r) for r in self.journal.read())
        return latest((r for r in recs if r is not None and r.alloc == self.alloc), job.job_id)

    def pool(self) -> SlurmPool:
        """The allocation and its spares, from ``squeue --json`` and ``sinfo --json``."""
        job = self.cli.job(self.alloc)
        if job is None:
            raise OSError(f"Slurm lists no job {self.alloc} (the allocation is gone)")
        return pool(self.cli.nodes(), job)

    def job_end(self) -> JobEnded | None:
        """The allocation's end, from ``squeue`` filtered to it (Slurm lists an ended job for
        ``MinJobAge`` seconds, then not at all: ``gone``)."""
        try:
            state = self.cli.job_state(self.alloc)
        except (SlurmCliError, SlurmParseError) as exc:
            raise OSError(str(exc)) from None
        end = scheduler_end(state[0] if state is not None else None)
        if end is None:
            return None
        said, reason = state if state is not None else ("not listed", "")
        return JobEnded(end=end, allocation=f"slurm:{self.alloc}", state=said[:64],
                        reason=reason[:1024])

    def live(self, job: JobSpec) -> list[Replica]:
        try:
            steps, nodes = self.cli.steps(), self.cli.nodes()
            alloc = self.cli.job(self.alloc)
        except SlurmCliError as exc:
            raise OSError(str(exc)) from None
        return [Replica(r.rank, r.unit, r.epoch, r.srun_pid)
                for r in proven_live(self.records(job), steps,
                                     alloc.nodes if alloc is not None else (), nodes)]

    def gone(self, step_id: str, timeout_s: float, poll_s: float = 0.2) -> bool:
        """True once Slurm no longer lists the step, or has given it up (``released``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            step = next((s for s in self.cli.steps() if s.step_id == step_id), None)
            if step is None:
                return True
            alloc = self.cli.job(self.alloc)
            if released(step, alloc.nodes if alloc is not None else (), self.cli.nodes()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)

    def epoch(self, job: JobSpec, rank: int | None = None) -> int:
        return max((e for (r, e) in self.records(job) if rank is None or r == rank), default=0)

    def step_of(self, job: JobSpec, rank: int, epoch: int) -> StepRecord | None:
        return self.records(job).get((rank, epoch))

    # --- acting --------------------------------------------------------------------------

    def launch(self, job: JobSpec, unit: UnitSpec, rank: int, epoch: int, port: int,
               command_id: str | None = None, master_addr: str | None = None) -> Replica:
        name = step_name(job.job_id, rank, epoch)
        argv = job.argv(rank, epoch, port, unit.name, master_addr)
        env = {k: v for k, v in self.cli.env.items() if not k.startswith(SECRET_ENV)}
        env.update({**job.env_for(unit.name), "TRAINGUARD_JOB_ID": job.job_id,
                    "TRAINGUARD_RANK": str(rank), "TRAINGUARD_WORLD_SIZE": str(job.world_size),
                    "TRAINGUARD_BINDING_EPOCH": str(epoch), "TRAINGUARD_UNIT": unit.name})
        srun = ["srun", f"--jobid={self.alloc}", "-N1", "-n1", f"--nodelist={unit.name}",
                "--overlap", f"--job-name={name}", "--export=ALL", "--quiet", *argv]
        logs = job.log_dir or self.log_dir
        logs.mkdir(parents=True, exist_ok=True)
        base = StepRecord(job.job_id, rank, epoch, unit.name, self.alloc, name, 0,
                          command_id=command_id)
        self.journal.append(base.to_record())  # the intent, before anything runs
        with open(logs / f"{job.job_id}-rank{rank}-e{epoch}.log", "ab") as out:
            proc = subprocess.Popen(srun, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        self._sruns[proc.pid] = proc
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                step = find_step(self.cli.steps(), self.alloc, name)
            except SlurmCliError as exc:
                step, why = None, str(exc)
            else:
                why = "not listed"
            if step is not None:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                _end(proc)
                raise OSError(f"srun for rank {rank} on {unit.name}: no step {name} "
                              f"({why}; srun exit {proc.returncode})")
            time.sleep(0.1)
        rec = StepRecord(job.job_id, rank, epoch, unit.name, self.alloc, name, proc.pid,
                         step.step_id, command_id)
        self.journal.append(rec.to_record())
        return Replica(rank, unit.name, epoch, proc.pid)

    def fence(self, job: JobSpec, replica: Replica) -> Released:
        rec = self.step_of(job, replica.rank, replica.epoch)
        if rec is None or not rec.step_id or rec.unit != replica.unit:
            return Released((f"rank {replica.rank} epoch {replica.epoch} on {replica.unit}: "
                             "not a step this actuator submitted: not cancelled",),
                            StopProof.NOT_OURS)
        try:
            how = self._fence_step(job, rec)
        except SlurmCliError as exc:
            raise FenceError(f"step {rec.step_id}: {exc}") from None
        popen = self._sruns.pop(rec.srun_pid, None)
        if popen is not None:
            _end(popen)
        return Released((f"slurm step {rec.step_id} ({rec.name}) on {rec.unit}: {how}",
                         f"node {rec.unit}"),
                        StopProof.ALREADY_GONE if how == "already gone" else
                        StopProof.SIGKILL if "KILL" in how or "DOWN" in how else
                        StopProof.SIGTERM)

    def _fence_step(self, job: JobSpec, rec: StepRecord) -> str:
        cli = self.cli
        node = self._node(rec.unit)
        if fence_start(node) == "down_first":
            # Slurm sees the node lost and may list its step given up already: that proves
            # nothing behind a partition, where the step still runs
            return self._down(rec, node, "node lost")
        if self.gone(rec.step_id, timeout_s=0):
            return "already gone"
        for sig, wait_s in (("TERM", job.grace_s), ("KILL", 5.0)):
            try:
                cli.cancel_step(rec.step_id, sig)
            except SlurmCliError as exc:
                # e.g. another node of the allocation is dead: scancel waits for it, then
                # fails (MessageTimeout), and the signal may well have gone through
                log.warning("step %s: %s", rec.step_id, exc)
            if self.gone(rec.step_id, timeout_s=wait_s):
                now = self._node(rec.unit)
                if fence_start(now) == "down_first":
                    # Slurm lost the node meanwhile (a partition outlasting SlurmdTimeout):
                    # it gave the step up, the node never acked the kill
                    return self._down(rec, now, "node lost during the cancel")
                return f"cancelled ({sig}), confirmed gone"
        if rec.unit in self.quarantined:  # a verdict points at this node: power it off
            return self._down(rec, node, "cancel unconfirmed")
        raise FenceError(f"step {rec.step_id}: still listed after TERM and KILL on "
                         f"{rec.unit}, which Slurm finds responding and no verdict points "
                         "at: not powered off")

    def _node(self, name: str) -> SlurmNode | None:
        """Slurm's view of one node now (None: Slurm does not know it)."""
        return next((n for n in self.cli.nodes() if n.name == name), None)

    def _down(self, rec: StepRecord, node: SlurmNode | None, why: str) -> str:
        """A node that cannot confirm: set DOWN (Slurm gives its steps up), powered off (what
        proves them gone: behind a partition they still run), then confirmed gone."""
        self.cli.set_down(rec.unit, _keep(node, f"fencing {rec.step_id} ({why})"))
        powered = self._power_off(rec.unit)
        try:
            self.cli.cancel_step(rec.step_id, "KILL")
        except SlurmCliError as exc:
            log.warning("step %s after DOWN: %s", rec.step_id, exc)
        if self.gone(rec.step_id, timeout_s=30):
            return f"{why}, node set DOWN, {powered}, confirmed gone or given up by Slurm"
        raise FenceError(f"step {rec.step_id}: still listed 30 s after its node was set DOWN")

    def _power_off(self, unit: str) -> str:
        if self.power_off is None:
            log.warning("node %s: no fence command (--fence-command): if it is only cut off, "
                        "its steps still run", unit)
            return "not powered off (no fence command: cut off, its processes may still run)"
        argv = [a.replace("{node}", unit) for a in self.power_off]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise FenceError(f"node {unit}: fence command {shlex.join(argv)}: {exc}") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip()[-300:]
            raise FenceError(f"node {unit}: fence command {shlex.join(argv)}: exit "
                             f"{done.returncode}: {tail}")
        return "powered off"

    def unusable(self, units: Sequence[str]) -> dict[str, str]:
        """Slurm's view of the units (``KnowsHealth``): a node Slurm does not know, one that
        is down, drained or not responding, or one outside the allocation. Unreadable: none
        (the job spec stands; a migrate still probes its spare)."""
        try:
            nodes = {n.name: n for n in self.cli.nodes()}
            alloc = self.cli.job(self.alloc)
        except SlurmCliError as exc:
            log.warning("pool: Slurm's view unreadable, the job spec stands: %s", exc)
            return {}
        out: dict[str, str] = {}
        for unit in units:
            node = nodes.get(unit)
            if node is None:
                out[unit] = f"slurm knows no node {unit}"
            elif node.health is not NodeHealth.USABLE:
                flags = "+".join(node.flags)
                out[unit] = (f"slurm: {node.state}{'+' + flags if flags else ''}"
                             f"{', reason ' + repr(node.reason) if node.reason else ''}")
            elif alloc is not None and unit not in alloc.nodes:
                out[unit] = f"slurm: not in allocation {self.alloc} ({','.join(alloc.nodes)})"
        return out

    def node_of(self, unit: str) -> str:
        """A unit is a Slurm node: its ``pool.unit`` events are located there (``UnitNodes``)."""
        return unit

    def drain(self, node: str, reason: str) -> None:
        """No new work on ``node``: Slurm keeps the reason (the incident id)."""
        self.cli.drain(node, reason)

    def quarantine(self, job: JobSpec, unit: str, reason: str) -> str:
        try:
            self.cli.drain(unit, reason)
        except SlurmCliError as exc:
            raise OSError(str(exc)) from None
        self.quarantined.add(unit)  # a node the loop's verdict blamed: fencing may power it off
        return f"node {unit} drained in Slurm: {reason}"

    def stop_stale(self, job: JobSpec, rank: int, epoch: int, pid: int | None) -> StaleAction:
        rec = self.step_of(job, rank, epoch)
        if rec is None or not rec.step_id:
            return "discarded"
        try:
            if self.gone(rec.step_id, timeout_s=0):
                return "already_gone"
            self.cli.cancel_step(rec.step_id, "KILL")
        except SlurmCliError as exc:
            log.warning("stale step %s: %s", rec.step_id, exc)
            return "already_gone"
        return "killed"

    def request_checkpoint(self, job: JobSpec, replica: Replica) -> str:
        rec = self.step_of(job, replica.rank, replica.epoch)
        if rec is None or not rec.step_id:
            raise OSError(f"rank {replica.rank} epoch {replica.epoch}: no step this actuator "
                          "submitted")
        try:
            self.cli.cancel_step(rec.step_id, "USR1")
        except SlurmCliError as exc:
            raise OSError(str(exc)) from None
        return f"SIGUSR1 to slurm step {rec.step_id} (rank {replica.rank})"

    def unreachable(self, job: JobSpec, unit: UnitSpec) -> str | None:
        """A step on the node writes a file in the checkpoint dir and, when the job names its
        agent socket (``TRAINGUARD_AGENT_SOCKET`` in its env), connects to the node's agent
        there: a spare whose agent is dead would take a rank whose reports go nowhere
        (``reach_script``)."""
        script = reach_script(str(job.ckpt_dir), unit.name,
                              job.env_for(unit.name).get(ENV_SOCKET))
        argv = ["srun", f"--jobid={self.alloc}", "-N1", "-n1", f"--nodelist={unit.name}",
                "--overlap", "--quiet", "--job-name=tg.reach", "sh", "-c", script]
        try:
            done = subprocess.run(argv, env=self.cli.env, capture_output=True, text=True,
                                  timeout=self.cli.timeout_s)
        except subprocess.TimeoutExpired:
            return f"{unit.name}: no answer from a probe step in {self.cli.timeout_s:g} s"
        if done.returncode != 0:
            # the probe's own last word, not srun's "task 0: Exited with exit code 1" after it
            lines = [ln for ln in (done.stderr + done.stdout).strip().splitlines()
                     if ln.strip() and not _SRUN_EXIT.search(ln)]
            last = lines[-1] if lines else f"exit {done.returncode}"
            agent = next((ln for ln in lines if ln.startswith("agent socket ")), None)
            if agent is not None:
                return f"{unit.name}: its trainguard agent does not answer: {agent}"
            return f"{job.ckpt_dir} from {unit.name}: {last}"
        return None


def _keep(node: SlurmNode | None, what: str) -> str:
    """A DOWN reason that keeps the drain's (the incident's) when trainguard set it."""
    if node is not None and node.reason.startswith("trainguard"):
        return f"{node.reason}; {what}"
    return f"trainguard: {what}"


def _end(proc: subprocess.Popen[bytes]) -> None:
    """The local srun client (its step is fenced through Slurm, not through this)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
