"""The local backend: ranks as real processes on this machine.

A unit is a CPU set (``sched_setaffinity``) plus a cgroup of the CPU controller (v1
``cpu.cfs_quota_us`` or v2 ``cpu.max``, through ``cgroups.py``) named ``<job>-<unit>`` under
``trainguard/``; tier 1 writes that cgroup's quota. When no CPU controller is writable, ranks
still run (without a cgroup) and ``set_quota`` fails naming why.

Each rank runs in its own session (so fencing signals its whole process group and an actuator
that dies does not take the job with it), with ``TRAINGUARD_JOB_ID``, ``TRAINGUARD_RANK``,
``TRAINGUARD_WORLD_SIZE``, ``TRAINGUARD_BINDING_EPOCH`` and ``TRAINGUARD_UNIT`` in its
environment (what ``trainguard_sdk.identity_from_env`` reads).
"""

from __future__ import annotations

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
from trainguard.actuators.backend import Released, Replica
from trainguard.actuators.fencing import is_replica_of, stop_process
from trainguard.actuators.jobspec import JobSpec, UnitSpec

# never handed to a rank: the command key and the Kafka credentials stay with the services
SECRET_ENV = ("TRAINGUARD_COMMAND_KEY", "TRAINGUARD_KAFKA_SASL_PASSWORD")


class LocalBackend:
    def __init__(self, log_dir: Path, *, use_cgroups: bool = True) -> None:
        self.log_dir = log_dir
        self.use_cgroups = use_cgroups
        self._children: dict[int, subprocess.Popen[bytes]] = {}
        self.cgroup_error: str | None = None
        self._zygote: subprocess.Popen[bytes] | None = None

    def _group(self, job: JobSpec, unit: UnitSpec) -> cgroups.CpuCgroup:
        return cgroups.create(f"{job.job_id}-{unit.name}")

    def launch(self, job: JobSpec, unit: UnitSpec, rank: int, epoch: int, port: int) -> Replica:
        argv = job.argv(rank, epoch, port, unit.name)
        if argv[0] == "python":
            argv[0] = sys.executable
        inherited = {k: v for k, v in os.environ.items() if not k.startswith(SECRET_ENV)}
        env = {**inherited, **job.env, "TRAINGUARD_JOB_ID": job.job_id,
               "TRAINGUARD_RANK": str(rank), "TRAINGUARD_WORLD_SIZE": str(job.world_size),
               "TRAINGUARD_BINDING_EPOCH": str(epoch),
               "TRAINGUARD_UNIT": unit.name}
        logs = job.log_dir or self.log_dir
        logs.mkdir(parents=True, exist_ok=True)
        cpus = set(unit.cpus) & os.sched_getaffinity(0)

        def in_child() -> None:
            if cpus:
                os.sched_setaffinity(0, cpus)

        log_path = logs / f"{job.job_id}-rank{rank}-e{epoch}.log"
        if job.preload:  # forked by the warm launcher: no import on the restart path
            pid = zygote.spawn(self.warm(job), argv[2], argv[3:], env, sorted(cpus), log_path)
        else:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True,
                                        preexec_fn=in_child)
            self._children[proc.pid] = proc
            pid = proc.pid
        if self.use_cgroups:
            try:
                self._group(job, unit).add(pid)
            except (cgroups.CgroupError, OSError) as exc:
                self.cgroup_error = str(exc)
        try:
            created: float | None = psutil.Process(pid).create_time()
        except psutil.Error:
            created = None
        return Replica(rank, unit.name, epoch, pid, created)

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
        popen = self._children.pop(replica.pid, None)
        stopped = stop_process(replica.pid, replica.create_time, job.grace_s, popen=popen)
        items = [stopped.describe()]
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
        return Released(tuple(items), stopped.how)

    def set_quota(self, job: JobSpec, unit: UnitSpec, pct: float | None) -> str:
        group = self._group(job, unit)  # raises CgroupError naming the controller problem
        group.set_quota_pct(pct)
        return f"cgroup {group.path} cpu quota {'unlimited' if pct is None else f'{pct:g}%'}"

    def request_checkpoint(self, job: JobSpec, replica: Replica) -> str:
        """SIGUSR1 to the replica (the workload's save-on-command, ``sdk/checkpoint``), only
        once its environment shows it is that rank of that job: a reused pid is never
        signalled."""
        if not is_replica_of(replica.pid, job.job_id, replica.rank):
            raise OSError(f"pid {replica.pid} is not rank {replica.rank} of {job.job_id} "
                          "(gone, or its pid reused)")
        if not catches(replica.pid, signal.SIGUSR1):
            # SIGUSR1's default action ends the process: a rank still starting would die
            raise OSError(f"rank {replica.rank} (pid {replica.pid}) does not handle SIGUSR1 "
                          "(yet): not asked, so as not to kill it")
        os.kill(replica.pid, signal.SIGUSR1)
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
    if not path.exists():
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(str(path))
        return True
    except OSError:
        return False
