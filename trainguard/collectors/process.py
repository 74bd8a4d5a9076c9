"""Rank processes of the jobs on this node: liveness, state, resources, and exits.

The agent registers each rank process it must watch (``register``); the collector then gives,
per interval, one ``ProcessSample`` per watched process and, exactly once per process, a
``Discrete(ProcessExit)`` when it ends.

How an exit is seen, best first:

- ``waitpid``: the agent handed in the ``subprocess.Popen`` (it is the parent); ``Popen.poll``
  reaps the child and gives the exact code or signal.
- ``pidfd``: otherwise a pidfd (``os.pidfd_open``, Linux >= 5.3) is held from registration on.
  It becomes readable the moment the process ends and always names *that* process, so a reused
  pid is never mistaken for it. The code comes from ``waitid(P_PIDFD, WNOWAIT)`` when the
  process is our child (peeked, not reaped, unless ``reap_children``), else from the zombie's
  ``/proc/<pid>/stat`` exit_code field, read only while the pidfd proves the zombie is still
  ours. A process whose code cannot be read still yields an exit, with ``exit_code=None``.
- ``psutil``: without pidfd support, each poll checks the pid and its start time.

A rank that says why it is leaving before it ends (the SDK's departure record, handed in by
the agent with ``declare``) has that attached to its exit (``ProcessExit.declared_*``): the
only account of an exit whose status cannot be read.

Pidfds are also exposed (``exit_fds``) and ``wait`` blocks on them, so the agent can publish an
exit as soon as it happens rather than at the next interval: call ``poll_exits`` then.
Not thread-safe: call it from the agent's loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal as signal_mod
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import psutil
from trainguard_sdk.identity import IdentityError, epoch_file

from trainguard.collectors.base import Discrete, Reading
from trainguard.events.envelope import Subject
from trainguard.events.payloads import ProcessDeparture, ProcessExit, ProcessSample, ProcessState

log = logging.getLogger(__name__)

DetectedBy = Literal["pidfd", "waitpid", "poll", "psutil"]

# psutil status strings -> our states. Anything else (waking, wakekill, locked...) is UNKNOWN.
_STATUS: dict[str, ProcessState] = {
    psutil.STATUS_RUNNING: ProcessState.RUNNING,
    psutil.STATUS_SLEEPING: ProcessState.SLEEPING,
    psutil.STATUS_DISK_SLEEP: ProcessState.SLEEPING,
    psutil.STATUS_IDLE: ProcessState.SLEEPING,
    psutil.STATUS_PARKED: ProcessState.SLEEPING,
    psutil.STATUS_STOPPED: ProcessState.STOPPED,
    psutil.STATUS_TRACING_STOP: ProcessState.STOPPED,
    psutil.STATUS_ZOMBIE: ProcessState.ZOMBIE,
    psutil.STATUS_DEAD: ProcessState.EXITED,
}

ENV_JOB_ID = "TRAINGUARD_JOB_ID"
ENV_RANK = "TRAINGUARD_RANK"
ENV_BINDING_EPOCH = "TRAINGUARD_BINDING_EPOCH"


# --- pure helpers ------------------------------------------------------------------------


def map_status(status: str) -> ProcessState:
    return _STATUS.get(status, ProcessState.UNKNOWN)


def split_wait_status(status: int) -> tuple[int | None, int | None]:
    """A raw waitpid(2) status -> (exit_code, signal); (None, None) if it is neither."""
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    return None, None


def split_returncode(returncode: int) -> tuple[int | None, int | None]:
    """``Popen.returncode`` -> (exit_code, signal): negative means killed by that signal."""
    if returncode < 0:
        return None, -returncode
    return returncode, None


def parse_stat_exit_code(stat: str) -> int | None:
    """The raw wait status in field 52 (exit_code) of a ``/proc/<pid>/stat`` line, if present.

    The comm field (2) may hold spaces and parentheses, so fields are counted after the last
    ')'. Linux < 3.5 has no field 52.
    """
    _, sep, rest = stat.rpartition(")")
    if not sep:
        return None
    fields = rest.split()
    # fields[0] is field 3 (state), so field 52 is fields[49].
    if len(fields) < 50:
        return None
    try:
        return int(fields[49])
    except ValueError:
        return None


# --- registry --------------------------------------------------------------------------


@dataclass(frozen=True)
class ExitInfo:
    exit_code: int | None
    signal: int | None
    detected_by: DetectedBy
    zombie: bool = False


@dataclass
class _Watched:
    pid: int
    job_id: str
    rank: int | None
    binding_epoch: int | None
    popen: subprocess.Popen[Any] | None = None
    gpu: int | None = None
    pidfd: int | None = None
    proc: psutil.Process | None = None
    cpu_primed: bool = False
    gone_at_register: bool = False
    declared: ProcessDeparture | None = None
    last: dict[str, Any] = field(default_factory=dict)


class ProcessCollector:
    """Watches registered rank processes. See the module docstring for how exits are seen."""

    name = "process"

    def __init__(self, node: str, *, use_pidfd: bool = True, reap_children: bool = False) -> None:
        """``node``: this node's name (the exits' subject). ``use_pidfd``: hold a pidfd per
        process where the kernel allows. ``reap_children``: when a registered pid without a
        ``Popen`` turns out to be our child, reap it (else it is only peeked with WNOWAIT, so a
        ``Popen`` or ``waitpid`` elsewhere still gets its code)."""
        self.node = node
        self.use_pidfd = use_pidfd and hasattr(os, "pidfd_open")
        self.reap_children = reap_children
        self._watched: dict[int, _Watched] = {}
        self._final_samples: list[ProcessSample] = []

    # registration ------------------------------------------------------------------------

    def register(
        self,
        pid: int,
        job_id: str,
        rank: int | None = None,
        binding_epoch: int | None = None,
        *,
        popen: subprocess.Popen[Any] | None = None,
        gpu: int | None = None,
    ) -> None:
        """Start watching ``pid`` (a rank of ``job_id``). Pass ``popen`` when the agent spawned
        it. Registering a pid again replaces the entry (e.g. a new binding epoch). A pid that
        is already gone is not refused: its exit (code unknown) is reported at the next poll."""
        if pid <= 0:
            raise ValueError(f"pid must be > 0, got {pid}")
        if popen is not None and popen.pid != pid:
            raise ValueError(f"popen.pid {popen.pid} != pid {pid}")
        old = self._watched.pop(pid, None)
        if old is not None:
            self._close(old)
        w = _Watched(pid=pid, job_id=job_id, rank=rank, binding_epoch=binding_epoch, popen=popen,
                     gpu=gpu, declared=None if old is None else old.declared)
        if self.use_pidfd:
            try:
                w.pidfd = os.pidfd_open(pid)
            except ProcessLookupError:
                w.gone_at_register = popen is None
            except OSError as exc:  # ENOSYS in old kernels / seccomp: fall back to psutil
                log.warning("pidfd_open(%d) failed (%s); falling back to psutil", pid, exc)
        if not w.gone_at_register:
            try:
                w.proc = psutil.Process(pid)
            except psutil.NoSuchProcess:
                w.gone_at_register = popen is None and w.pidfd is None
        self._watched[pid] = w

    def register_popen(
        self,
        popen: subprocess.Popen[Any],
        job_id: str,
        rank: int | None = None,
        binding_epoch: int | None = None,
    ) -> None:
        self.register(popen.pid, job_id, rank, binding_epoch, popen=popen)

    def declare(self, pid: int, departure: ProcessDeparture) -> bool:
        """What the watched process ``pid`` said just before ending; its exit carries it. The
        first one counts (a process ends once). False if ``pid`` is not watched."""
        w = self._watched.get(pid)
        if w is None:
            return False
        if w.declared is None:
            w.declared = departure
        return True

    def unregister(self, pid: int) -> bool:
        """Stop watching ``pid`` without reporting an exit. False if it was not watched."""
        w = self._watched.pop(pid, None)
        if w is None:
            return False
        self._close(w)
        return True

    def discover(
        self,
        env_job_id: str = ENV_JOB_ID,
        env_rank: str = ENV_RANK,
        env_binding_epoch: str = ENV_BINDING_EPOCH,
    ) -> list[int]:
        """Register processes whose environment names a job (``TRAINGUARD_JOB_ID``, and
        optionally ``TRAINGUARD_RANK`` / ``TRAINGUARD_BINDING_EPOCH``, which the file
        ``TRAINGUARD_BINDING_EPOCH_FILE`` names overrides as for the SDK: an elastic job's
        worker restarted by its launcher). Returns new pids."""
        found: list[int] = []
        for proc in psutil.process_iter():
            if proc.pid in self._watched or proc.pid == os.getpid():
                continue
            try:
                env = proc.environ()
            except (psutil.Error, OSError):
                continue
            job = env.get(env_job_id)
            if not job:
                continue
            try:
                written = epoch_file(env)
            except IdentityError:
                written = None  # unreadable: the environment's
            epoch = written if written is not None else _int_or_none(env.get(env_binding_epoch))
            self.register(proc.pid, job, _int_or_none(env.get(env_rank)), epoch,
                          gpu=gpu_of(env))
            found.append(proc.pid)
        return found

    def watched(self) -> list[int]:
        return sorted(self._watched)

    def jobs(self) -> list[str]:
        """The jobs with a watched process on this node."""
        return sorted({w.job_id for w in self._watched.values()})

    def exit_fds(self) -> list[int]:
        """The pidfds held: each turns readable when its process ends (for select/asyncio)."""
        return [w.pidfd for w in self._watched.values() if w.pidfd is not None]

    def wait(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` until a watched process has ended; then ``poll_exits``.

        Returns True at once when an exit is already pending. Without pidfds it only sleeps
        out the timeout when nothing is pending, so the caller still polls once per interval.
        """
        poller = select.poll()
        fds = self.exit_fds()
        # Entries without a pidfd (pidfd off, psutil fallback) are checked now instead.
        if any(self._peek_exit(w) for w in self._watched.values() if w.pidfd is None):
            return True
        for fd in fds:
            poller.register(fd, select.POLLIN)
        if not fds:
            if timeout_s > 0:
                select.select([], [], [], timeout_s)
            return False
        return bool(poller.poll(max(0, int(timeout_s * 1000))))

    def close(self) -> None:
        for w in self._watched.values():
            self._close(w)
        self._watched.clear()

    # collection --------------------------------------------------------------------------

    def poll_exits(self, now_us: int) -> list[Discrete]:
        """Exits seen now, each reported once; their last samples go into the next collect."""
        out: list[Discrete] = []
        for pid in list(self._watched):
            w = self._watched[pid]
            info = self._check_exit(w)
            if info is None:
                continue
            del self._watched[pid]
            self._close(w)
            out.append(self._exit_event(w, info, now_us))
            self._final_samples.append(self._final_sample(w, info))
        return out

    def collect(self, now_us: int) -> Reading:
        reading = Reading()
        for w in list(self._watched.values()):
            sample = self._sample(w)
            if sample is not None:
                reading.processes.append(sample)
        # Exits after sampling: a pidfd still quiet now proves the samples were of our process.
        reading.discrete.extend(self.poll_exits(now_us))
        exited = {s.pid for s in self._final_samples}
        reading.processes = [s for s in reading.processes if s.pid not in exited]
        reading.processes.extend(self._final_samples)
        self._final_samples = []
        return reading

    # internals ---------------------------------------------------------------------------

    def _exit_event(self, w: _Watched, info: ExitInfo, now_us: int) -> Discrete:
        said = w.declared
        payload = ProcessExit(pid=w.pid, rank=w.rank, binding_epoch=w.binding_epoch,
                              exit_code=info.exit_code, signal=info.signal,
                              detected_by=info.detected_by,
                              declared_code=None if said is None else said.exit_code,
                              declared_cause=None if said is None else said.cause,
                              declared_reason=None if said is None else said.reason)
        log.info("rank process %d (job %s, rank %s) exited: code=%s signal=%s via %s%s",
                 w.pid, w.job_id, w.rank, info.exit_code, info.signal, info.detected_by,
                 "" if said is None else f", said {said.cause.value} {said.exit_code}")
        return Discrete(payload=payload, job_id=w.job_id, event_time=now_us,
                        subject=Subject(node=self.node, rank=w.rank))

    def _final_sample(self, w: _Watched, info: ExitInfo) -> ProcessSample:
        return ProcessSample(pid=w.pid, rank=w.rank, job_id=w.job_id, gpu=w.gpu,
                             state=ProcessState.ZOMBIE if info.zombie else ProcessState.EXITED,
                             exit_code=info.exit_code)

    def _sample(self, w: _Watched) -> ProcessSample | None:
        proc = w.proc
        if proc is None:
            return None
        state = ProcessState.UNKNOWN
        cpu: float | None = None
        rss: int | None = None
        threads: int | None = None
        try:
            with proc.oneshot():
                state = map_status(proc.status())
                with contextlib.suppress(psutil.AccessDenied):
                    pct = proc.cpu_percent(interval=None)
                    cpu = pct if w.cpu_primed else None
                    w.cpu_primed = True
                with contextlib.suppress(psutil.AccessDenied):
                    rss = proc.memory_info().rss
                with contextlib.suppress(psutil.AccessDenied):
                    threads = proc.num_threads()
        except psutil.ZombieProcess:
            state = ProcessState.ZOMBIE
        except psutil.NoSuchProcess:
            return None  # the exit check right after reports it
        except psutil.AccessDenied:
            pass
        return ProcessSample(pid=w.pid, rank=w.rank, job_id=w.job_id, gpu=w.gpu, state=state,
                             cpu_pct=cpu, rss_bytes=rss, threads=threads)

    def _peek_exit(self, w: _Watched) -> bool:
        """Cheap 'has it ended?' without consuming anything."""
        if w.popen is not None:
            return w.popen.poll() is not None
        if w.pidfd is not None:
            return _readable(w.pidfd)
        return w.gone_at_register or not _alive(w.proc)

    def _check_exit(self, w: _Watched) -> ExitInfo | None:
        if w.popen is not None:
            rc = w.popen.poll()
            if rc is None:
                return None
            code, sig = split_returncode(rc)
            return ExitInfo(code, sig, "waitpid")
        if w.gone_at_register:
            return ExitInfo(None, None, "psutil")
        if w.pidfd is not None:
            if not _readable(w.pidfd):
                return None
            return self._code_via_pidfd(w.pid, w.pidfd)
        if _alive(w.proc):
            return None
        return self._code_via_psutil(w)

    def _code_via_pidfd(self, pid: int, pidfd: int) -> ExitInfo:
        flags = os.WEXITED | os.WNOHANG | (0 if self.reap_children else os.WNOWAIT)
        try:
            res = os.waitid(os.P_PIDFD, pidfd, flags)
        except ChildProcessError:
            res = None  # not our child (or already reaped by its Popen): read the zombie
        except OSError:
            res = None
        if res is not None:
            code, sig = _from_waitid(res)
            return ExitInfo(code, sig, "pidfd", zombie=not self.reap_children)
        status = _read_stat_exit_code(pid)
        # The stat read is ours only if the pidfd's process is still a zombie afterwards.
        if status is not None and _pidfd_exists(pidfd):
            code, sig = split_wait_status(status)
            return ExitInfo(code, sig, "pidfd", zombie=True)
        return ExitInfo(None, None, "pidfd")

    def _code_via_psutil(self, w: _Watched) -> ExitInfo:
        proc = w.proc
        if proc is not None:
            try:
                if proc.status() == psutil.STATUS_ZOMBIE:
                    status = _read_stat_exit_code(w.pid)
                    if status is not None and proc.is_running():
                        code, sig = split_wait_status(status)
                        return ExitInfo(code, sig, "psutil", zombie=True)
            except psutil.Error:
                pass
        return ExitInfo(None, None, "psutil")

    @staticmethod
    def _close(w: _Watched) -> None:
        if w.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(w.pidfd)
            w.pidfd = None


# --- small system helpers ----------------------------------------------------------------


def _readable(fd: int) -> bool:
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(0))


def _pidfd_exists(pidfd: int) -> bool:
    """True while the pidfd's process exists (zombie included): signal 0 only checks."""
    try:
        signal_mod.pidfd_send_signal(pidfd, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return False
    return True


def _alive(proc: psutil.Process | None) -> bool:
    """Running (zombies count as ended); ``is_running`` also compares the start time."""
    if proc is None:
        return False
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _read_stat_exit_code(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return parse_stat_exit_code(f.read())
    except OSError:
        return None


def _from_waitid(res: Any) -> tuple[int | None, int | None]:
    code: int = res.si_code
    status: int = res.si_status
    if code == os.CLD_EXITED:
        return status, None
    if code in (os.CLD_KILLED, os.CLD_DUMPED):
        return None, status
    return None, None


def gpu_of(env: Mapping[str, str]) -> int | None:
    """The GPU index a rank process uses on its node, as its environment says: the one device
    of ``CUDA_VISIBLE_DEVICES`` (an index; a UUID or several devices say nothing certain),
    else ``LOCAL_RANK`` (torchrun's one-GPU-per-local-rank convention); None otherwise."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    if visible:
        return _int_or_none(visible) if "," not in visible else None
    return _int_or_none(env.get("LOCAL_RANK"))


def _int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value >= 0 else None


def exits_of(discretes: Iterable[Discrete]) -> list[ProcessExit]:
    """The ``ProcessExit`` payloads among ``discretes`` (a convenience for callers/tests)."""
    return [d.payload for d in discretes if isinstance(d.payload, ProcessExit)]
