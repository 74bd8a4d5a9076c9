"""Slurm's CLIs, at the edge: every call bounded in time, its output parsed by ``slurm_view``.

Only the real commands are used (``sinfo``, ``squeue``, ``scontrol``, ``scancel``), never Slurm's
state files. A command that fails or times out raises ``SlurmCliError`` naming the command and
Slurm's own message. ``SLURM_CONF`` (and anything else) comes from ``env``.

Fencing a step is ``scancel`` and then *confirming* it gone: a step is gone when ``scontrol show
step`` no longer lists it (no accounting daemon is assumed, so not ``sacct``). A node that cannot
confirm (its slurmd silent) is set DOWN first, which makes Slurm itself give up on that node's
part of the step.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence

from trainguard.actuators.slurm_view import (
    JOB_STATE_FORMAT,
    SlurmJob,
    SlurmNode,
    SlurmStep,
    parse_job_state,
    parse_scontrol_steps,
    parse_sinfo_json,
    parse_squeue_json,
)


class SlurmCliError(RuntimeError):
    """A Slurm command failed; the message names it and quotes Slurm."""


def spurious_cancel_error(message: str, step_id: str) -> bool:
    """scancel's failure after it signalled a live step (Slurm 22.05, measured here: the
    step's trap ran, then ``exit 225: scancel: error: Kill job error on job step id <job>:
    Invalid job id specified``, naming the job alone, whatever the step or ``--overlap``). A
    job that does not exist names the whole step id and exits 1: that one is real."""
    job = step_id.split(".", 1)[0]
    return ("exit 225:" in message and message.endswith(
        f"Kill job error on job step id {job}: Invalid job id specified"))


class SlurmCli:
    def __init__(self, env: Mapping[str, str] | None = None, timeout_s: float = 15.0) -> None:
        self.env = dict(os.environ if env is None else env)
        self.timeout_s = timeout_s

    def _run(self, argv: Sequence[str]) -> str:
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, env=self.env,
                                  timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            raise SlurmCliError(f"{' '.join(argv)}: no answer in {self.timeout_s:g} s") from None
        except OSError as exc:
            raise SlurmCliError(f"{' '.join(argv)}: {exc.strerror}") from None
        if done.returncode != 0:
            msg = (done.stderr or done.stdout).strip().splitlines()
            raise SlurmCliError(f"{' '.join(argv)}: exit {done.returncode}: "
                                f"{msg[-1] if msg else 'no message'}")
        return done.stdout

    # -- reading ------------------------------------------------------------------------------

    def nodes(self) -> list[SlurmNode]:
        return parse_sinfo_json(self._run(["sinfo", "--json"]))

    def jobs(self) -> list[SlurmJob]:
        return parse_squeue_json(self._run(["squeue", "--json"]))

    def job(self, job_id: int) -> SlurmJob | None:
        return next((j for j in self.jobs() if j.job_id == job_id), None)

    def job_state(self, job_id: int) -> tuple[str, str] | None:
        """The job's state and reason, asked of slurmctld for that job alone (``squeue --json``
        lists the whole queue in 22.05, whatever ``--jobs`` says); None when Slurm does not
        list it."""
        try:
            out = self._run(["squeue", "--noheader", "--states=all", f"--jobs={job_id}",
                             f"--format={JOB_STATE_FORMAT}"])
        except SlurmCliError as exc:
            if str(exc).endswith("Invalid job id specified"):
                return None
            raise
        return parse_job_state(out, job_id)

    def steps(self) -> list[SlurmStep]:
        return parse_scontrol_steps(self._run(["scontrol", "-o", "show", "step"]))

    # -- acting -------------------------------------------------------------------------------

    def drain(self, node: str, reason: str) -> None:
        """No new work on ``node``; the reason (the incident id) shows in sinfo/scontrol."""
        self._run(["scontrol", "update", f"NodeName={node}", "State=DRAIN",
                   f"Reason={_reason(reason)}"])

    def set_down(self, node: str, reason: str) -> None:
        self._run(["scontrol", "update", f"NodeName={node}", "State=DOWN",
                   f"Reason={_reason(reason)}"])

    def resume(self, node: str) -> None:
        self._run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])

    def cancel_step(self, step_id: str, signal: str = "KILL") -> None:
        """``signal`` to the step. Neither outcome of scancel proves anything about it: a
        step that does not exist exits 0 silently, and 22.05 here delivers the signal to a
        live step, then exits 225 (``spurious_cancel_error``). ``confirm_gone`` (or the save
        a USR1 asked for) is the proof."""
        try:
            self._run(["scancel", f"--signal={signal}", step_id])
        except SlurmCliError as exc:
            if not spurious_cancel_error(str(exc), step_id):
                raise

    def confirm_gone(self, step_id: str, timeout_s: float = 30.0,
                     poll_s: float = 0.2) -> bool:
        """True once Slurm lists no step ``step_id``; False if it still does at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            if all(s.step_id != step_id for s in self.steps()):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


def _reason(text: str) -> str:
    """A reason Slurm keeps as given: one line, no '=' (it would start another field)."""
    return " ".join(text.replace("=", ":").split())[:120] or "trainguard"
