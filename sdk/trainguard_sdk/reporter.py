"""``StepReporter``: the hook a training script calls once per step.

    with StepReporter("job-42", rank, world_size, dp_rank=dp) as tg:
        for batch in loader:
            ...
            tg.step(step, samples, compute_ms, comm_ms=comm, loss=loss.item())
            if step % 500 == 0:
                tg.heartbeat(phase="checkpoint")
                save()

Every report is one datagram (``wire.py``) on a connected, non-blocking Unix datagram socket
to the node agent. ``step()`` and ``heartbeat()`` never block and never raise: a report that
cannot go (no agent, the agent's queue is full, a value that does not fit the wire) is counted
in ``dropped`` and they return False; ``sent`` counts the others. The agent validates values
against the payload models; the reporter only refuses what it cannot encode (negative ints,
non-numbers), counted in ``invalid`` as well as ``dropped``.

A daemon thread sends a heartbeat every ``heartbeat_interval_s`` (default 1 s) with the last
step and the current phase ("init" until the first step, "step" after each ``step()``, or what
``heartbeat(phase=...)`` set), so the agent sees the rank alive through long steps, data waits
and checkpoints. It shows the *process* is alive; progress is the step number. The thread never
keeps the process alive, and stops on ``close()``, which also sends a last "idle" heartbeat.

``section(Section.BACKWARD)`` says where in its step the rank is now (data, forward, backward,
optimizer, checkpoint, comm); the heartbeats carry it with the wall-clock time the heartbeat
side first saw the rank in it (at most one heartbeat interval late), so the agent's rules can
say "rank 5 stuck in backward for 60 s" with a bound learned from how long that section
usually takes. It is one attribute store: no clock read, no lock, no send (the heartbeat
thread tells one section instance from the next by the section and the last step).
``step()`` ends the section (the step is done; the next heartbeat says no section until the
next ``section()``), and so do ``close()`` and ``end_section()``.

``checkpoint()`` sends one checkpoint record (written, verified, corrupt, loaded) for the
agent to publish as a ``checkpoint`` event; ``trainguard_sdk.checkpoint`` calls it.

``leaving(code, cause, reason)`` says, once, that the rank is about to end and why: the agent
attaches it to the rank's ``process.exit`` (under Slurm or torchrun the agent is not the rank's
parent and cannot read the exit status). Say ``leaving(0, "completed")`` when training ended;
an uncaught exception says it by itself: the first reporter installs a ``sys.excepthook``
(chained to the one before it) that sends ``leaving(1, cause_of(exc), ...)`` for every live
reporter, ``peer_lost`` when the exception is a collective failing because a peer went away
(``trainguard_sdk.departure``); so does an exception (or ``sys.exit(n)``: n) leaving a
``with StepReporter(...)`` block. A rank killed by a signal says nothing: that silence is the
evidence that points at it.

Pass plain numbers: a tensor would be converted with ``float()``, which synchronises the
device (``loss.item()`` costs the same, but visibly). ``step()`` is not thread-safe against
itself: call it from the training loop's thread. After ``fork`` the child reports its own pid,
runs no heartbeat thread and sends no "idle" on close.

The socket path: ``socket_path``, else ``trainguard_sdk.paths.default_socket_path()``
(``$TRAINGUARD_AGENT_SOCKET``, else ``/run/trainguard/agent.sock``, ...).
"""

from __future__ import annotations

import atexit
import errno
import os
import sys
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType
from typing import Final

from trainguard_sdk import wire
from trainguard_sdk.departure import cause_of, one_line, reason_of
from trainguard_sdk.link import Link
from trainguard_sdk.paths import default_socket_path

_time_ns = time.time_ns
_PACK_VAR = wire.STEP_VAR.pack_into
_VAR_OFF: Final = wire.STEP_VAR_OFFSET
_SHARD: Final = wire.STEP_SHARD_OFFSET
_COMM: Final = wire.STEP_COMM_MS
_WAIT: Final = wire.STEP_DATA_WAIT_MS
_STEP_MS: Final = wire.STEP_STEP_MS
_LOSS: Final = wire.STEP_LOSS

_LIVE: weakref.WeakSet[StepReporter] = weakref.WeakSet()
CHECKPOINT_RETRIES: Final = 10
CHECKPOINT_RETRY_S: Final = 0.001
_RETRY_ERRNOS: Final = frozenset({errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOBUFS, errno.EINTR})


class StepReporter:
    def __init__(
        self,
        job_id: str,
        rank: int,
        world_size: int,
        *,
        dp_rank: int | None = None,
        pp_stage: int | None = None,
        tp_rank: int | None = None,
        binding_epoch: int = 0,
        socket_path: str | os.PathLike[str] | None = None,
        heartbeat_interval_s: float | None = 1.0,
        reconnect_interval_s: float = 0.25,
    ) -> None:
        """Identity errors (a job id or rank the wire or the envelope refuses) raise
        ValueError here, at setup; nothing raises afterwards. ``heartbeat_interval_s=None``
        runs no heartbeat thread. ``reconnect_interval_s``: how often a missing agent is
        looked for again."""
        if world_size < 1:
            raise ValueError(f"world_size: must be >= 1, got {world_size!r}")
        if heartbeat_interval_s is not None and not heartbeat_interval_s > 0:
            raise ValueError(f"heartbeat_interval_s: > 0 or None, got {heartbeat_interval_s!r}")
        self.job_id = job_id
        self.rank = rank
        self.world_size = world_size
        self.dp_rank, self.pp_stage, self.tp_rank = dp_rank, pp_stage, tp_rank
        self.binding_epoch = binding_epoch
        self._job = wire.check_job_id(job_id)
        self.pid = os.getpid()
        self._buf, self._id_flags = self._identity()
        self._hb_buf = self._heartbeat_buf()
        self._hb_bg_buf = self._heartbeat_buf()
        self.socket_path = Path(socket_path) if socket_path is not None else default_socket_path()
        self._link = Link(str(self.socket_path), reconnect_interval_s)
        self._bg_link = Link(str(self.socket_path), reconnect_interval_s)
        self.invalid = 0
        self._phase = "init"
        self._phase_mark = self._tail()  # the (step, time) bytes when the phase was set
        self._section: wire.Section | None = None  # set by section(), cleared by step()
        # the heartbeat side's view: (section, step tail) it last saw, and since when (ns)
        self._seen: tuple[wire.Section, bytes, int] | None = None  # one reference, whole
        self.heartbeat_interval_s = heartbeat_interval_s
        self._closed = False
        self._departed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        ref = weakref.ref(self)

        def at_exit() -> None:
            reporter = ref()
            if reporter is not None:
                reporter.close()

        self._at_exit = at_exit
        atexit.register(at_exit)
        _LIVE.add(self)
        _install_excepthook()
        if heartbeat_interval_s is not None:
            self._thread = threading.Thread(
                target=self._beat, args=(heartbeat_interval_s,),
                name=f"trainguard-heartbeat-{rank}", daemon=True)
            self._thread.start()

    # -- counters ---------------------------------------------------------------------------

    @property
    def sent(self) -> int:
        return self._link.sent + self._bg_link.sent

    @property
    def dropped(self) -> int:
        return self._link.dropped + self._bg_link.dropped + self.invalid

    @property
    def last_step(self) -> int | None:
        """The last step reported (read back from the datagram buffer: step() stores nothing
        else)."""
        step, at_ns = wire.STEP_TAIL.unpack_from(self._buf, wire.STEP_STEP_OFFSET)
        return step if at_ns else None

    @property
    def phase(self) -> str:
        """What the next heartbeat says: "step" once a step came after the last phase set."""
        return "step" if self._tail() != self._phase_mark else self._phase

    @property
    def connected(self) -> bool:
        return self._link.sock is not None

    @property
    def section_now(self) -> wire.Section | None:
        """The section the next heartbeat reports (None: none since the last step)."""
        return self._section

    # -- the hot path -----------------------------------------------------------------------

    def section(self, section: wire.Section) -> None:
        """The rank enters ``section`` now (until the next ``section()``, ``step()`` or
        ``end_section()``). Never raises; no clock, no lock, no syscall."""
        self._section = section

    def end_section(self) -> None:
        self._section = None

    def step(
        self,
        step: int,
        samples_consumed: int,
        compute_ms: float,
        comm_ms: float | None = None,
        data_wait_ms: float | None = None,
        step_ms: float | None = None,
        loss: float | None = None,
        shard_offset: int | None = None,
    ) -> bool:
        """Report one finished step (and end the current section). True if the datagram went
        to the agent."""
        self._section = None
        flags = self._id_flags
        if comm_ms is None:
            comm_ms = 0.0
        else:
            flags |= _COMM
        if data_wait_ms is None:
            data_wait_ms = 0.0
        else:
            flags |= _WAIT
        if step_ms is None:
            step_ms = 0.0
        else:
            flags |= _STEP_MS
        if loss is None:
            loss = 0.0
        else:
            flags |= _LOSS
        if shard_offset is None:
            shard_offset = 0
        else:
            flags |= _SHARD
        buf = self._buf
        try:
            _PACK_VAR(buf, _VAR_OFF, flags, samples_consumed, shard_offset, compute_ms, comm_ms,
                      data_wait_ms, step_ms, loss, step, _time_ns())
        except Exception:  # out of range or not a number: never into the training loop
            self._invalid_step()
            return False
        link = self._link
        send = link.send_fn
        if send is None:
            return link.send(buf)
        try:
            send(buf)
        except OSError as exc:
            link.failed(exc)
            return False
        link.sent += 1
        return True

    def heartbeat(self, phase: str = "step") -> bool:
        """Send a heartbeat now, and report ``phase`` in the following ones (until the next
        ``step()``). Phases: init, step, data, checkpoint, idle."""
        if phase not in wire.PHASE_INDEX:
            self.invalid += 1
            return False
        self._set_phase(phase)
        return self._send_heartbeat(self._link, self._hb_buf)

    def checkpoint(
        self,
        action: str,
        step: int,
        samples_consumed: int,
        path: str,
        *,
        sha256: str | None = None,
        size_bytes: int | None = None,
        write_ms: float | None = None,
        reason: str | None = None,
    ) -> bool:
        """Report a checkpoint record (action: written, verified, corrupt, loaded). Never
        raises; True if the datagram went to the agent. Call it from the training loop's
        thread (it shares ``step()``'s socket). Not the hot path: the datagram is built per
        call, and a full agent queue is retried for up to ~10 ms (``CHECKPOINT_RETRIES``),
        because a checkpoint record is rare and is recovery evidence."""
        try:
            data = wire.encode_checkpoint(wire.CheckpointFrame(
                job_id=self.job_id, event_time=_time_ns() // 1000, rank=self.rank,
                action=action, step=step,  # type: ignore[arg-type]  # checked by the encoder
                samples_consumed=samples_consumed, path=path, sha256=sha256,
                size_bytes=size_bytes, write_ms=write_ms, reason=reason,
                binding_epoch=self.binding_epoch, pid=self.pid))
        except Exception:  # a value the wire refuses: counted, never raised
            self.invalid += 1
            return False
        return self._send_rare(data)

    def leaving(self, exit_code: int, cause: str = "error", reason: str | None = None) -> bool:
        """Say that this rank is about to end with ``exit_code`` (0..255) and why: ``cause``
        one of "completed", "peer_lost" (a collective failed because another rank was lost),
        "error" (its own failure); ``reason`` goes on one line, cut to 500 characters. Once
        per reporter: later calls return False. Never raises; True if the datagram went to the
        agent (retried like ``checkpoint()``)."""
        if self._departed or self._closed or os.getpid() != self.pid:
            return False
        self._departed = True
        try:
            data = wire.encode_departure(wire.DepartureFrame(
                job_id=self.job_id, event_time=_time_ns() // 1000, rank=self.rank,
                cause=cause,  # type: ignore[arg-type]  # checked by the encoder
                exit_code=exit_code, reason=None if reason is None else one_line(reason),
                binding_epoch=self.binding_epoch, pid=self.pid))
        except Exception:  # a value the wire refuses: counted, never raised
            self.invalid += 1
            return False
        return self._send_rare(data)

    def departing(self, exc: BaseException) -> bool:
        """Say the departure ``exc`` makes, if it ends the rank: ``sys.exit(n)`` leaves with n
        ("completed" for 0), another exception with 1 and ``cause_of(exc)``; Ctrl-C says
        nothing. What the excepthook and a ``with`` block call; a framework callback that
        sees the exception before the reporter is closed calls it too."""
        if isinstance(exc, KeyboardInterrupt):
            return False
        if isinstance(exc, SystemExit):
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            return self.leaving(code & 0xFF, "completed" if code == 0 else "error",
                                f"exit({exc.code!r})")
        return self.leaving(1, cause_of(exc), reason_of(exc))

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the heartbeat thread, send a last "idle" heartbeat, close the sockets.
        Idempotent; reports after it are dropped."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        self._section = None
        if os.getpid() == self.pid and self._forked_from is None:
            self._set_phase("idle")
            self._send_heartbeat(self._link, self._hb_buf)
        self._link.close()
        self._bg_link.close()
        _LIVE.discard(self)

    def __enter__(self) -> StepReporter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """An exception leaving the block (it will end the rank, and the excepthook would
        find this reporter closed) is said as the rank's departure first."""
        if exc is not None:
            self.departing(exc)
        self.close()

    # -- internals --------------------------------------------------------------------------

    _forked_from: int | None = None

    def _send_rare(self, data: bytes) -> bool:
        """Send a rare record (checkpoint, departure): a full agent queue is retried for up
        to ~10 ms (``CHECKPOINT_RETRIES``), because such a record is recovery evidence."""
        link = self._link
        for attempt in range(CHECKPOINT_RETRIES + 1):
            if link.send(data):
                return True
            if link.last_errno not in _RETRY_ERRNOS or attempt == CHECKPOINT_RETRIES:
                return False
            link.dropped -= 1  # this attempt is retried, not dropped
            time.sleep(CHECKPOINT_RETRY_S)
        return False  # pragma: no cover - the loop always returns

    def _identity(self) -> tuple[bytearray, int]:
        return wire.step_identity(self._job, self.pid, self.rank, self.world_size, self.dp_rank,
                                  self.pp_stage, self.tp_rank, self.binding_epoch)

    def _heartbeat_buf(self) -> bytearray:
        buf = bytearray(wire.HEARTBEAT_FIXED + len(self._job))
        buf[wire.HEARTBEAT_FIXED:] = self._job
        return buf

    def _invalid_step(self) -> None:
        # The failed pack zeroed (step, time): heartbeats say "step" with no step number.
        self.invalid += 1
        self._set_phase("step")

    def _set_phase(self, phase: str) -> None:
        self._phase = phase
        self._phase_mark = self._tail()

    def _tail(self) -> bytes:
        return bytes(self._buf[wire.STEP_STEP_OFFSET:wire.STEP_FIXED])

    def _send_heartbeat(self, link: Link, buf: bytearray) -> bool:
        tail = self._tail()  # before the section: see _section_start
        step, at_ns = wire.STEP_TAIL.unpack_from(tail)
        phase = self.phase
        section = self._section
        now = _time_ns()
        start_ns = None if section is None else self._section_start(section, tail, now)
        try:
            wire.pack_heartbeat(buf, len(self._job), self.pid, self.rank, self.binding_epoch,
                                wire.PHASE_INDEX[phase], now, step if at_ns else None,
                                section, start_ns)
        except Exception:  # cannot happen with checked identity; counted, never raised
            link.dropped += 1
            return False
        return link.send(buf)

    def _section_start(self, section: wire.Section, tail: bytes, now: int) -> int:
        """When the heartbeat side first saw this section instance: a new (section, last step)
        is a new instance. The step tail is read before the section, so a step() in between
        can only split an instance (a later start), never join two."""
        seen = self._seen
        if seen is None or seen[0] is not section or seen[1] != tail:
            seen = self._seen = (section, tail, now)
        return seen[2]

    def _beat(self, interval_s: float) -> None:
        self._send_heartbeat(self._bg_link, self._hb_bg_buf)
        while not self._stop.wait(interval_s):
            self._send_heartbeat(self._bg_link, self._hb_bg_buf)

    def _after_fork_in_child(self) -> None:
        self._forked_from = self.pid
        self.pid = os.getpid()
        wire.STEP_ID.pack_into(self._buf, wire.STEP_ID_OFFSET, self.pid, self.rank,
                               self.world_size, self.dp_rank or 0, self.pp_stage or 0,
                               self.tp_rank or 0, self.binding_epoch)
        self._thread = None  # threads do not survive fork


def _after_fork() -> None:
    for reporter in list(_LIVE):
        reporter._after_fork_in_child()


_hooked: list[bool] = []


def _install_excepthook() -> None:
    """Once per process: chain ``sys.excepthook`` so that an uncaught exception makes every
    live reporter say why the rank is leaving before the traceback is printed."""
    if _hooked:
        return
    _hooked.append(True)
    previous = sys.excepthook

    def hook(tp: type[BaseException], value: BaseException,
             tb: TracebackType | None) -> None:
        try:
            for reporter in list(_LIVE):
                reporter.departing(value)
        except Exception:  # pragma: no cover - never in the way of the traceback
            pass
        previous(tp, value, tb)

    sys.excepthook = hook


os.register_at_fork(after_in_child=_after_fork)
