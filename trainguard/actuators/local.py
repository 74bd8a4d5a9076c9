"""The local backend: ranks as real processes on this machine.

A unit is a CPU set (``sched_setaffinity``) plus a cgroup of the CPU controller (v1
``cpu.cfs_quota_us`` or v2 ``cpu.max``, through ``cgroups.py``) named ``<job>-<unit>`` under
``trainguard/``; tier 1 writes that cgroup's quota. When no CPU controller is writable, ranks
still run (without a cgroup) and ``set_quota`` fails naming why.

Each rank runs in its own session (so fencing signals its whole process group and an actuator
that dies does not take the job with it), with ``TRAINGUARD_JOB_ID``, ``TRAINGUARD_RANK``,
``TRAINGUARD_WORLD_SIZE``, ``TRAINGUARD_BINDING_EPOCH`` and ``TRAINGUARD_UNIT`` in its
environment (what ``trainguard_sdk.identity_from_env`` reads).

Every rank is written to the replica journal (``journal.py``; default
``<log_dir>/replicas.journal``) before it may run: a cold rank starts as a tiny gate
(``GATE``) that waits on a pipe, the backend records its pid, start time and boot id
(fsync), then opens the gate and the gate ``exec``s the rank (same pid, same start time). An
actuator that dies before the record is written closes the pipe, and the gate exits instead.
A warm rank is forked by the zygote the same way (the zygote writes its record). Every signal
(fence, stale kill, save request) goes to a pid proven against its record through a pidfd.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from trainguard.actuators import cgroups, zygote
from trainguard.actuators.backend import Released, Replica, StaleAction
from trainguard.actuators.fencing import (
    Identity,
    identify,
    kill_now,
    open_proven,
    send,
    stop_process,
)
from trainguard.actuators.jobspec import JobSpec, UnitSpec
from trainguard.actuators.journal import Journal, ReplicaRecord, replicas
from trainguard.events.payloads import StopProof

log = logging.getLogger(__name__)

# never handed to a rank: the signing keys and the Kafka credentials stay with the services
SECRET_ENV = ("TRAINGUARD_COMMAND_KEY", "TRAINGUARD_ACTUATOR_KEY",
              "TRAINGUARD_KAFKA_SASL_PASSWORD")
# the rank's first instructions: wait until the journal holds its record ("g" on the pipe),
# then become the rank; EOF (the actuator died first) -> exit without running anything
GATE = ("import os,sys\nfd=int(sys.argv[1])\ngo=os.read(fd,1)==b'g'\nos.close(fd)\n"
        "if not go: os._exit(70)\nos.execvp(sys.argv[2],sys.argv[2:])")


class LocalBackend:
    def __init__(self, log_dir: Path, *, use_cgroups: bool = True,
                 journal: Path | None = None) -> None:
        self.log_dir = log_dir
        self.use_cgroups = use_cgroups
        self.journal_path = journal or log_dir / "replicas.journal"
        self.journal = Journal(self.journal_path)
        if self.journal.skipped:
            log.warning("replica journal %s: %d corrupt record(s) skipped", self.journal_path,
                        self.journal.skipped)
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self.cgroup_error: str | None = None
        self._zygote: subprocess.Popen[bytes] | None = None

    def _group(self, job: JobSpec, unit: UnitSpec) -> cgroups.CpuCgroup:
        return cgroups.create(f"{job.job_id}-{unit.name}")

    def launch(self, job: JobSpec, unit: UnitSpec, rank: int, epoch: int, port: int,
               command_id: str | None = None, master_addr: str | None = None) -> Replica:
        argv = job.argv(rank, epoch, port, unit.name, master_addr)
        if argv[0] == "python":
            argv[0] = sys.executable
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(SECRET_ENV)}
        env = {**inherited, **job.env_for(unit.name), "TRAINGUARD_JOB_ID": job.job_id,
               "TRAINGUARD_RANK": str(rank), "TRAINGUARD_WORLD_SIZE": str(job.world_size),
               "TRAINGUARD_BINDING_EPOCH": str(epoch),
               "TRAINGUARD_UNIT": unit.name}
        logs = job.log_dir or self.log_dir
        logs.mkdir(parents=True, exist_ok=True)
        cpus = set(unit.cpus) & os.sched_getaffinity(0)
        who: dict[str, str | int | None] = {"job": job.job_id, "rank": rank, "epoch": epoch,
                                            "unit": unit.name, "command_id": command_id}
        log_path = logs / f"{job.job_id}-rank{rank}-e{epoch}.log"
        if job.preload:  # forked by the warm launcher: no import on the restart path
            pid = zygote.spawn(self.warm(job), argv[2], argv[3:], env, sorted(cpus), log_path,
                               journal=self.journal_path, record=who)
        else:
            pid = self._launch_cold(argv, env, cpus, log_path, job, unit, who)
        if self.use_cgroups and job.preload:
            self._add_to_cgroup(job, unit, pid)
        try:
            created: float | None = psutil.Process(pid).create_time()
        except psutil.Error:
            created = None
        return Replica(rank, unit.name, epoch, pid, created)

    def _launch_cold(self, argv: list[str], env: dict[str, str], cpus: set[int],
                     log_path: Path, job: JobSpec, unit: UnitSpec,
                     who: dict[str, str | int | None]) -> int:
        def in_child() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)

        gate_r, gate_w = os.pipe()
        try:
            with open(log_path, "ab") as log:
                gate = [sys.executable, "-I", "-S", "-c", GATE, str(gate_r)]
                proc = subprocess.Popen([*gate, *argv],
                                        env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        preexec_fn=in_child, pass_fds=(gate_r,))
            os.close(gate_r)
            gate_r = -1
            self._children[proc.pid] = proc
            ident = identify(proc.pid)
            if ident is None:
                raise OSError(f"rank {who['rank']}: its process {proc.pid} died at once")
            if self.use_cgroups:
                self._add_to_cgroup(job, unit, proc.pid)
            self.journal.append(_record(ident, who))  # written first ...
            os.write(gate_w, b"g")  # ... then the rank may run
        finally:
            if gate_r >= 0:
                os.close(gate_r)
            os.close(gate_w)
        return proc.pid

    def _add_to_cgroup(self, job: JobSpec, unit: UnitSpec, pid: int) -> None:
        try:
            self._group(job, unit).add(pid)
        except (cgroups.CgroupError, OSError) as exc:
            self.cgroup_error = str(exc)

    # --- what the journal proves -------------------------------------------------------

    def records(self, job: JobSpec) -> list[ReplicaRecord]:
        return replicas(self.journal, job.job_id)

    def _record_of(self, job: JobSpec, rank: int, pid: int,
                   epoch: int | None = None) -> ReplicaRecord | None:
        """The newest journal record of ``pid`` as that rank of the job (at ``epoch``)."""
        for rec in reversed(self.records(job)):
            if rec.pid == pid:  # newest first: an older record of a reused pid is stale
                ok = rec.rank == rank and (epoch is None or rec.epoch == epoch)
                return rec if ok else None
        return None

    def live(self, job: JobSpec) -> list[Replica]:
        out: dict[int, Replica] = {}
        for rec in self.records(job):
            pidfd = open_proven(_identity(rec))
            if pidfd is None:
                out.pop(rec.pid, None)
                continue
            os.close(pidfd)
            out[rec.pid] = Replica(rec.rank, rec.unit, rec.epoch, rec.pid)
        return sorted(out.values(), key=lambda r: (r.rank, r.epoch, r.pid))

    def epoch(self, job: JobSpec, rank: int | None = None) -> int:
        return max((r.epoch for r in self.records(job) if rank is None or r.rank == rank),
                   default=0)

    def stop_stale(self, job: JobSpec, rank: int, epoch: int, pid: int | None) -> StaleAction:
        rec = self._record_of(job, rank, pid, epoch) if pid is not None else None
        if rec is None:
            return "discarded"
        return "killed" if kill_now(_identity(rec)) else "already_gone"

    def warm(self, job: JobSpec, timeout_s: float = 300.0) -> Path:
        """The job's warm launcher (started once, reused across actuator restarts): a process
        that imported ``job.preload`` and forks ranks. Returns its socket once it answers."""
        logs = job.log_dir or self.log_dir
        logs.mkdir(parents=True, exist_ok=True)
        path = logs / f"zygote-{job.job_id}.sock"
        if _answers(path):
            return path
        if self._zygote is None or self._zygote.poll() is not None:
            argv = [sys.executable, "-m", "trainguard.actuators.zygote", "--socket", str(path)]
            for name in job.preload:
                argv += ["--preload", name]
            env = {k: v for k, v in os.environ.items() if not k.startswith(SECRET_ENV)}
            with open(logs / f"zygote-{job.job_id}.log", "ab") as log:
                self._zygote = subprocess.Popen(argv, env=env, stdout=log,
                                                stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL,
                                                start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not _answers(path):
            if self._zygote.poll() is not None:
                raise OSError(f"the warm launcher exited ({self._zygote.returncode}); see "
                              f"{logs / f'zygote-{job.job_id}.log'}")
            if time.monotonic() > deadline:
                raise OSError(f"the warm launcher did not answer within {timeout_s:.0f} s")
            time.sleep(0.1)
        return path

    def fence(self, job: JobSpec, replica: Replica) -> Released:
        rec = self._record_of(job, replica.rank, replica.pid)
        if rec is None:
            items = [f"process {replica.pid}: not a replica this actuator started (no record "
                     "in its journal): not signalled"]
            how = StopProof.NOT_OURS
        else:
            popen = self._children.pop(replica.pid, None)
            stopped = stop_process(_identity(rec), job.grace_s, popen=popen)
            items = [stopped.describe()]
            how = StopProof(stopped.how)
        unit = job.unit(replica.unit)
        if self.use_cgroups:
            try:
                group = self._group(job, unit)
                group.remove()
                items.append(f"cgroup {group.path}")
            except (cgroups.CgroupError, OSError) as exc:
                items.append(f"cgroup not removed: {exc}")
        if unit.cpus:
            items.append("cpus " + ",".join(map(str, unit.cpus)))
        return Released(tuple(items), how)

    def set_quota(self, job: JobSpec, unit: UnitSpec, pct: float | None) -> str:
        group = self._group(job, unit)  # raises CgroupError naming the controller problem
        group.set_quota_pct(pct)
        return f"cgroup {group.path} cpu quota {'unlimited' if pct is None else f'{pct:g}%'}"

    def request_checkpoint(self, job: JobSpec, replica: Replica) -> str:
        """SIGUSR1 to the replica (the workload's save-on-command, ``sdk/checkpoint``), only
        once it is proven to be the process the journal recorded as that rank: a reused pid,
        or one this actuator never started, is never signalled."""
        rec = self._record_of(job, replica.rank, replica.pid)
        if rec is None or (pidfd := open_proven(_identity(rec))) is None:
            raise OSError(f"pid {replica.pid} is not rank {replica.rank} of {job.job_id} "
                          "(not in the replica journal, gone, or its pid reused)")
        os.close(pidfd)
        if not catches(replica.pid, signal.SIGUSR1):
            # SIGUSR1's default action ends the process: a rank still starting would die
            raise OSError(f"rank {replica.rank} (pid {replica.pid}) does not handle SIGUSR1 "
                          "(yet): not asked, so as not to kill it")
        if not send(_identity(rec), signal.SIGUSR1):
            raise OSError(f"rank {replica.rank} (pid {replica.pid}) is gone")
        return (f"SIGUSR1 to rank {replica.rank} (pid {replica.pid}): the job saves at its "
                "next request-poll step")

    def unreachable(self, job: JobSpec, unit: UnitSpec) -> str | None:
        """The simplest honest check of compute-data co-location: can this machine (every
        local unit's node) stat the checkpoint dir and create, fsync and remove a file there?"""
        probe = job.ckpt_dir / f".reach-{unit.name}-{uuid.uuid4().hex[:8]}"
        try:
            os.stat(job.ckpt_dir)
            fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_EXCL, 0o600)
            try:
                os.write(fd, b"ok")
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            return f"{job.ckpt_dir}: {exc.strerror or exc}"
        return None


def _identity(rec: ReplicaRecord) -> Identity:
    return Identity(rec.pid, rec.start_ticks, rec.boot_id)


def _record(ident: Identity, who: dict[str, str | int | None]) -> dict[str, object]:
    return {"kind": "replica", **who, "pid": ident.pid, "start_ticks": ident.start_ticks,
            "boot_id": ident.boot_id}


def catches(pid: int, signum: int, proc: Path = Path("/proc")) -> bool:
    """Has the process installed a handler for ``signum``? (``SigCgt`` in its status.)"""
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def _answers(path: Path) -> bool:
    if not zygote.socket_path(path).exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(str(zygote.socket_path(path)))
        return True
    except OSError:
        return False
