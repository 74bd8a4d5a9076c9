"""The agent's end of the step socket: step reports and heartbeats from the trainer ranks.

``StepReceiver`` binds the Unix datagram socket the SDK sends to (``trainguard_sdk``; format
in ``sdk/trainguard_sdk/wire.py``). It creates the socket's directory (``dir_mode``, 0o755 by
default; an existing directory is left as it is), removes a stale socket file (one nobody is
bound to: a probe connect is refused) but refuses to take over a live one or to delete a file
that is not a socket, and sets the socket's mode (0o660 by default: trainers must be the
agent's user or in its group; pass 0o666 to open it to every local user).

Each valid datagram becomes ``Discrete(StepReport | Heartbeat | CheckpointEvent |
ProcessDeparture, job_id, event_time, Subject(node=<this node>, rank=...))``, in arrival order;
the agent publishes a ``CheckpointEvent`` as a ``checkpoint`` event (the rank that wrote,
verified or loaded it is the subject's) and a ``ProcessDeparture`` as a ``process.departure``
(and attaches it to the rank's exit). A malformed one (bad magic, version, kind, length, flags,
phase, action, cause or job id, an event time past 2**53, or values the payload model refuses:
``invalid_step_report`` / ``invalid_heartbeat`` / ``invalid_checkpoint`` /
``invalid_departure``) is counted in ``Reading.malformed``
by kind, logged once per kind, and skipped; the datagrams around it are kept.

Two ways to drain, both non-blocking, from the agent's one thread:

- ``collect(now_us)`` (the ``Collector`` protocol) / ``drain()``: a ``Reading``;
- ``fileno()`` + ``drain_discrete()`` (or ``reader()``): for ``loop.add_reader``, so reports
  are published as they arrive; malformed counts seen there go out with the next ``drain()``.

Linux caps a datagram socket's queue at ``net.unix.max_dgram_qlen`` datagrams (10 by default),
whatever the buffer sizes: a receiver that falls behind makes the trainers drop reports (they
count them). Drain on readability, and raise the sysctl on busy nodes (``queue_limit`` shows
it; a warning is logged below 64).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import math
import os
import socket
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from pydantic import ValidationError
from trainguard_sdk import wire
from trainguard_sdk.paths import default_socket_path

from trainguard.collectors.base import Discrete, Reading
from trainguard.events.envelope import Subject
from trainguard.events.payloads import (
    CheckpointAction,
    CheckpointEvent,
    DepartureCause,
    Heartbeat,
    ProcessDeparture,
    Section,
    StepReport,
)

log = logging.getLogger(__name__)

MAX_EVENT_TIME: Final = 2**53
# the wire's section index -> the contract's Section (same order; a unit test keeps them equal)
_SECTIONS: Final = {w: Section(w.name.lower()) for w in wire.SECTIONS}
QLEN_SYSCTL: Final = Path("/proc/sys/net/unix/max_dgram_qlen")
QLEN_WARN_BELOW: Final = 64


@dataclass(slots=True)
class RankSeen:
    """The last report of one (job, rank): for liveness. Times are the trainer's event time."""

    event_time: int
    kind: str  # "step" or "heartbeat"
    step: int | None
    pid: int | None
    phase: str


class StepReceiver:
    name = "steps"

    def __init__(
        self,
        node: str,
        socket_path: str | os.PathLike[str] | None = None,
        *,
        mode: int = 0o660,
        dir_mode: int = 0o755,
        max_per_drain: int = 10_000,
    ) -> None:
        """Bind now. Raises OSError if the socket cannot be bound, if another receiver is
        live on ``socket_path`` (EADDRINUSE) or the path is not a socket (EEXIST); ValueError
        for a node name the envelope refuses. ``max_per_drain`` bounds one drain call (the
        rest stays queued, and the fd readable)."""
        self.node = node
        Subject(node=node)  # a bad node name fails here, not on the first datagram
        self.path = Path(socket_path) if socket_path is not None else default_socket_path()
        self.max_per_drain = max_per_drain
        self.received = 0
        self.last_seen: dict[tuple[str, int], RankSeen] = {}
        self.malformed_total: dict[str, int] = {}
        self._pending: dict[str, int] = {}
        self._logged: set[str] = set()
        self._buf = bytearray(wire.MAX_DATAGRAM)
        self._view = memoryview(self._buf)
        self._subjects: dict[int, Subject] = {}
        self._sock = self._bind(mode, dir_mode)
        self._ino = os.stat(self.path).st_ino
        self.queue_limit = _queue_limit()
        if self.queue_limit is not None and self.queue_limit < QLEN_WARN_BELOW:
            _warn_small_queue(self.queue_limit)

    # -- socket ------------------------------------------------------------------------------

    def _bind(self, mode: int, dir_mode: int) -> socket.socket:
        self.path.parent.mkdir(mode=dir_mode, parents=True, exist_ok=True)
        _remove_stale(self.path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            sock.bind(str(self.path))
            os.chmod(self.path, mode)
        except BaseException:
            sock.close()
            raise
        return sock

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        """Close the socket and remove its file (only if it is still ours)."""
        if self._sock.fileno() < 0:
            return
        self._sock.close()
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._ino:
                os.unlink(self.path)

    def __enter__(self) -> StepReceiver:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- draining ----------------------------------------------------------------------------

    def collect(self, now_us: int) -> Reading:
        return self.drain()

    def drain(self, max_datagrams: int | None = None) -> Reading:
        """Everything queued now (at most ``max_datagrams``), plus the malformed counts not
        yet reported."""
        discrete = self.drain_discrete(max_datagrams)
        malformed, self._pending = self._pending, {}
        return Reading(discrete=discrete, malformed=malformed)

    def drain_discrete(self, max_datagrams: int | None = None) -> list[Discrete]:
        """The valid reports queued now, in arrival order; never blocks, never raises."""
        out: list[Discrete] = []
        if self._sock.fileno() < 0:
            return out
        recv_into = self._sock.recv_into
        view = self._view
        limit = self.max_per_drain if max_datagrams is None else max_datagrams
        for _ in range(limit):
            try:
                n = recv_into(self._buf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._count("recv_error", f"recv failed: {exc}")
                break
            self.received += 1
            item = self._handle(view[:n])
            if item is not None:
                out.append(item)
        return out

    def reader(self) -> tuple[int, Callable[[], Sequence[Discrete]]]:
        """``(fd, drain)`` for the agent's readers."""
        return self.fileno(), self.drain_discrete

    def stale(self, now_us: int, older_than_us: int) -> list[tuple[str, int]]:
        """(job, rank) pairs whose last report is older than ``older_than_us``."""
        return [key for key, seen in self.last_seen.items()
                if now_us - seen.event_time > older_than_us]

    # -- one datagram ------------------------------------------------------------------------

    def _handle(self, data: memoryview) -> Discrete | None:
        try:
            frame = wire.decode(data)
        except wire.WireError as err:
            self._count(err.kind, str(err))
            return None
        if frame.event_time >= MAX_EVENT_TIME:
            self._count("invalid_event_time", str(frame.event_time))
            return None
        if isinstance(frame, wire.CheckpointFrame):
            return self._checkpoint(frame)
        if isinstance(frame, wire.DepartureFrame):
            return self._departure(frame)
        payload: StepReport | Heartbeat
        try:
            if isinstance(frame, wire.StepFrame):
                payload = StepReport(
                    rank=frame.rank, world_size=frame.world_size, dp_rank=frame.dp_rank,
                    pp_stage=frame.pp_stage, tp_rank=frame.tp_rank,
                    binding_epoch=frame.binding_epoch, step=frame.step,
                    samples_consumed=frame.samples_consumed, shard_offset=frame.shard_offset,
                    compute_ms=frame.compute_ms, comm_ms=frame.comm_ms,
                    data_wait_ms=frame.data_wait_ms, step_ms=frame.step_ms, loss=frame.loss,
                    pid=frame.pid)
                seen = RankSeen(frame.event_time, "step", frame.step, frame.pid, "step")
            else:
                payload = Heartbeat(
                    rank=frame.rank, binding_epoch=frame.binding_epoch, step=frame.step,
                    phase=frame.phase, pid=frame.pid,
                    section=None if frame.section is None else _SECTIONS[frame.section],
                    section_start=frame.section_start)
                seen = RankSeen(frame.event_time, "heartbeat", frame.step, frame.pid,
                                frame.phase)
        except ValidationError as exc:
            kind = "invalid_step_report" if isinstance(frame, wire.StepFrame) else \
                "invalid_heartbeat"
            self._count(kind, _first_error(exc))
            return None
        key = (frame.job_id, frame.rank)
        prev = self.last_seen.get(key)
        if prev is None or prev.event_time <= frame.event_time:
            self.last_seen[key] = seen
        return Discrete(payload, frame.job_id, frame.event_time, self._subject(frame.rank))

    def _checkpoint(self, frame: wire.CheckpointFrame) -> Discrete | None:
        try:
            payload = CheckpointEvent(
                action=CheckpointAction(frame.action), step=frame.step,
                samples_consumed=frame.samples_consumed, path=frame.path, sha256=frame.sha256,
                size_bytes=frame.size_bytes, write_ms=frame.write_ms, reason=frame.reason)
        except ValidationError as exc:
            self._count("invalid_checkpoint", _first_error(exc))
            return None
        return Discrete(payload, frame.job_id, frame.event_time, self._subject(frame.rank))

    def _departure(self, frame: wire.DepartureFrame) -> Discrete | None:
        try:
            payload = ProcessDeparture(
                rank=frame.rank, binding_epoch=frame.binding_epoch, pid=frame.pid,
                cause=DepartureCause(frame.cause), exit_code=frame.exit_code,
                reason=frame.reason)
        except ValidationError as exc:
            self._count("invalid_departure", _first_error(exc))
            return None
        return Discrete(payload, frame.job_id, frame.event_time, self._subject(frame.rank))

    def _subject(self, rank: int) -> Subject:
        subject = self._subjects.get(rank)
        if subject is None:
            if len(self._subjects) > 65_536:
                self._subjects.clear()
            subject = self._subjects[rank] = Subject(node=self.node, rank=rank)
        return subject

    def _count(self, kind: str, detail: str) -> None:
        self._pending[kind] = self._pending.get(kind, 0) + 1
        self.malformed_total[kind] = self.malformed_total.get(kind, 0) + 1
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("step socket %s: malformed datagram (%s): %s; further ones of this "
                        "kind are only counted", self.path, kind, detail)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    value = err.get("input")
    if isinstance(value, float) and not math.isfinite(value):
        value = repr(value)
    return f"{'.'.join(str(p) for p in err['loc'])}={value!r}: {err['msg']}"


def _remove_stale(path: Path) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise OSError(errno.EEXIST, "exists and is not a socket; not removing it", str(path))
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        log.info("removing stale step socket %s", path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    except FileNotFoundError:
        return
    finally:
        probe.close()
    raise OSError(errno.EADDRINUSE, "another receiver is bound to this socket", str(path))


@functools.cache
def _warn_small_queue(limit: int) -> None:  # once per process
    log.warning("net.unix.max_dgram_qlen is %d: a busy node may drop step reports; raise it "
                "(e.g. sysctl -w net.unix.max_dgram_qlen=512)", limit)


def _queue_limit() -> int | None:
    try:
        return int(QLEN_SYSCTL.read_text().strip())
    except (OSError, ValueError):
        return None
