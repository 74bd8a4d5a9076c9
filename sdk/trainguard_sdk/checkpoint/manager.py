"""``CheckpointManager``: save every N steps and on command, atomically, with a checksummed
manifest, keeping the last K; resume from the newest checkpoint every rank verified, falling
back past corrupt ones; report every checkpoint record (written, verified, corrupt, loaded)
through a sink (the ``StepReporter``: the node agent publishes them as ``checkpoint`` events).

    manager = CheckpointManager(CheckpointConfig(Path("/data/ckpt/job-42"), every_steps=100),
                                job_id="job-42", collective=TorchCollective(), sink=reporter)
    manager.install_request_signal()              # SIGUSR1 -> save at the next step
    restored = manager.resume(model, optimizer)   # None: a fresh start
    step = restored.progress.step if restored else 0
    position = restored.progress.samples_consumed if restored else 0
    while step < total:
        step += 1
        ... train on the samples at ``position`` ...; position += global_batch
        if manager.due(step):
            manager.save(step, position, model, optimizer)

Save on command. Either send SIGUSR1 to any rank's process (``request_signal``), or create
the file ``<directory>/SAVE_NOW`` (``request_file``; rank 0 looks for it on polling steps);
``request_save()`` is the same from code. ``due()`` adds no collective and no GPU sync to a
step: periodic saves follow from ``every_steps``, which every rank knows; the rank that got a
request writes the step to save at into the process group's c10d store, and every rank reads
that key on polling steps (every ``poll_every`` steps, one store round trip), so every rank
saves the same step, ``poll_every + 1`` to ``2 * poll_every`` steps after the request (see
``schedule.py`` for why that is safe). A single process saves at the step it sees the
request. A collective without a store (a custom one) falls back to agreeing with a one-integer
MAX all-reduce on polling steps.

Two layouts (``CheckpointConfig.layout``; the manifest says which one a checkpoint has, and
``resume`` reads both):

- ``"state_pt"`` (the default): ``state.pt`` (``torch.save`` of the model's and the optimizer's
state dicts, written by rank 0: data-parallel ranks hold the same ones) and one
``rank-NNNNN.json`` per rank (step, samples consumed, the RNG states of Python, NumPy when
imported, torch and CUDA, and the caller's ``extra``), then ``MANIFEST.json`` (see
``manifest.py`` / ``store.py``). Every file is written to a temp file, fsync'd, renamed, and
the directory fsync'd; the manifest goes last, so a crash mid-save leaves no checkpoint, never
a torn one. The directory must be shared by every rank (one file system).

- ``"dcp"``: ``torch.distributed.checkpoint``. Each rank writes its own shard
  (``__<rank>_0.distcp``; DDP's replicated tensors are written once, spread over the ranks;
  FSDP2's DTensors by the rank that holds them), hashed as it is written; rank 0 writes DCP's
  ``.metadata``. With ``async_save`` (the default) ``save()`` returns once the state is
  staged (copied), and the write, the per-rank ``rank-NNNNN.json``, the gathering of every
  rank's checksums and rank 0's manifest (written last, atomically) run on a background
  thread, on a gloo process group of their own (``TorchCollective.side()``), so they never
  interleave with the training loop's collectives. One save in flight at a time: the next
  ``save()`` first waits for the previous one; ``wait()`` waits now; a background failure is
  raised by the next ``save()``, ``wait()`` or ``close()`` as ``CheckpointWriteError`` (an
  ``OSError``). Records from the background are sent from the training thread at the next
  ``due()``, ``save()``, ``wait()`` or ``close()``. Verification at resume is shared: each
  rank checks every world_size-th file, and the ranks agree.

  ``stage_in_background`` (opt-in, with ``async_save``): ``save()`` clones only the buffers
  (BatchNorm statistics and the like: a forward pass changes them, DDP broadcasts them) and
  returns; the parameters and the optimizer state are copied on the save's thread while the
  next step's forward and backward read them, and a step pre-hook on the optimizer makes
  ``optimizer.step()`` wait until the copy is done (``last_step_wait_ms``). It is for training
  in which only ``optimizer.step()`` changes the parameters and the optimizer's state between
  a save and the next step (no in-place edits of the weights in between). State with DTensors
  (FSDP2) is staged in ``save()`` as without it. ``bench/bench_checkpoint.py`` prints the
  stall (``save()`` plus the wait) against a synchronous save, and how much the step after a
  save slows down: on the 2-core CPU development host the background write slows that step
  by more than a synchronous save costs (both compete for the same cores and the GIL), so
  there the training thread's stall is small but the time lost is not; with the step on a
  GPU the cores are free for it.

Resume: the ranks list the checkpoints, newest first; each verifies the candidate fully
(manifest checksum, every file's size and checksum) and they agree (all ranks must find it
valid); a corrupt one is reported (``corrupt``, with the reason) and the previous one is tried.
The chosen one is read again with the bytes checked as they are loaded (``loaded``). Rank 0
moves the corrupt and never-committed ones newer than it to ``quarantine/``. Events: rank 0
sends ``written``; every rank sends ``verified``, ``corrupt`` and ``loaded`` for what it did
itself (the event's subject carries the rank).
"""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final, Protocol, cast

import torch

from trainguard_sdk.checkpoint import checksum as cks
from trainguard_sdk.checkpoint import manifest as mf
from trainguard_sdk.checkpoint import rng
from trainguard_sdk.checkpoint.atomic import atomic_write, atomic_write_bytes, fsync_dir
from trainguard_sdk.checkpoint.collective import Collective, Solo
from trainguard_sdk.checkpoint.location import durable_directory
from trainguard_sdk.checkpoint.schedule import (
    KeyValueStore,
    LocalRequests,
    SharedRequests,
    is_periodic,
)
from trainguard_sdk.checkpoint.store import CheckpointStore, CorruptFile, Invalid, Valid

log = logging.getLogger(__name__)

STATE_FILE: Final = "state.pt"
RANK_FORMAT: Final = 1


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.json"


class CheckpointSink(Protocol):
    """Where checkpoint records go (``StepReporter.checkpoint`` fits). Must not raise."""

    def checkpoint(self, action: str, step: int, samples_consumed: int, path: str, *,
                   sha256: str | None = None, size_bytes: int | None = None,
                   write_ms: float | None = None, reason: str | None = None) -> bool: ...


class CheckpointIncompatible(ValueError):
    """A valid checkpoint this job cannot continue from (another world size, another job)."""


class CheckpointWriteError(OSError):
    """A background (async) save failed on some rank; the message names the rank(s)."""


@dataclass(frozen=True)
class CheckpointConfig:
    directory: Path
    every_steps: int = 0  # 0: only on command
    keep: int = 3
    allow_tmp: bool = False
    request_signal: int | None = signal.SIGUSR1
    request_file: str | None = "SAVE_NOW"
    poll_every: int = 5  # steps between reads of pending save requests; 0 = never poll
    verify_after_write: bool = False
    layout: str = mf.LAYOUT_STATE_PT  # or mf.LAYOUT_DCP: sharded, through DCP
    async_save: bool = True  # dcp layout: write in the background
    write_threads: int = 1  # dcp layout: DCP's writer threads per rank
    # torch.save's per-record CRC32 duplicates the manifest's checksum and costs as much:
    # off by default (torch.load reads such files the same).
    torch_crc32: bool = False
    # The data files' checksum in the manifest (``checksum.py``); None: by layout, crc32 for
    # dcp (computed as the bytes are written at the speed of a plain write + fsync; sha256
    # runs at about half of that on a busy host), sha256 for state_pt (its manifests stay
    # format 1, readable by every older reader). Either finds a corrupt file; the manifest
    # names it, so both load.
    checksum: str | None = None
    # dcp layout with async_save: the staging copy runs on the save's thread, overlapping the
    # next step's forward and backward, and the optimizer's next step() waits for it (a step
    # pre-hook): save() returns after cloning the buffers only. Only for training whose
    # parameters and optimizer state change in optimizer.step() alone (no in-place edits of
    # the weights between a save and the next step); see the module's text.
    stage_in_background: bool = False
    # How errors name the settings (the CLI passes its flags).
    setting_names: tuple[str, str] = ("directory", "allow_tmp")

    def __post_init__(self) -> None:
        for name in ("every_steps", "poll_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: >= 0, got {getattr(self, name)!r}")
        if self.keep < 1:
            raise ValueError(f"keep: >= 1, got {self.keep!r}")
        if self.layout not in mf.LAYOUTS:
            raise ValueError(f"layout: one of {mf.LAYOUTS}, got {self.layout!r}")
        if self.checksum is not None and self.checksum not in cks.ALGORITHMS:
            raise ValueError(f"checksum: one of {cks.ALGORITHMS}, got {self.checksum!r}")
        if self.write_threads < 1:
            raise ValueError(f"write_threads: >= 1, got {self.write_threads!r}")


    @property
    def file_checksum(self) -> str:
        if self.checksum is not None:
            return self.checksum
        return cks.CRC32 if self.layout == mf.LAYOUT_DCP else cks.SHA256


@dataclass(frozen=True)
class Progress:
    step: int
    samples_consumed: int


@dataclass(frozen=True)
class Restored:
    progress: Progress
    path: Path
    manifest_sha256: str
    extra: dict[str, Any] = field(default_factory=dict)
    rng: list[str] = field(default_factory=list)  # the generators restored
    skipped: list[str] = field(default_factory=list)  # newer ones refused, with the reason


class _InFlight:
    """One background save: its thread, and what it ended with."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.thread: threading.Thread | None = None
        self.result: Valid | None = None
        self.error: BaseException | None = None


class CheckpointManager:
    def __init__(self, config: CheckpointConfig, *, job_id: str,
                 collective: Collective | None = None, sink: CheckpointSink | None = None,
                 store: KeyValueStore | None = None) -> None:
        """``CheckpointLocationError`` when the directory is a scratch one and not allowed.
        ``store``: where save requests travel between ranks (default: the collective's,
        i.e. the default process group's c10d store)."""
        self.config = config
        self.job_id = job_id
        self.collective: Collective = collective if collective is not None else Solo()
        self.rank = self.collective.rank
        self.world_size = self.collective.world_size
        self.sink = sink
        setting, allow = config.setting_names
        self.root = durable_directory(config.directory, allow_tmp=config.allow_tmp,
                                      setting=setting, allow_setting=allow)
        self.store = CheckpointStore(self.root)
        self._requested = False
        self._pruner: threading.Thread | None = None
        self._inflight: _InFlight | None = None
        self._outbox: deque[tuple[str, int, int, Path, dict[str, Any]]] = deque()
        self._background = threading.local()  # .active: this thread is a background save
        self._stager: Any = None  # dcp layout: the staging buffers, reused save after save
        self.last_saved: Valid | None = None
        self.last_stall_ms: float | None = None  # the training thread's time in save()
        # stage_in_background: the training thread's wait in the next optimizer step for the
        # staging copy (0.0 when it was done by then); part of the save's stall
        self.last_step_wait_ms: float | None = None
        self._staged: threading.Event | None = None  # set once the save in flight is staged
        self._hooks: dict[int, Any] = {}  # id(optimizer) -> its step pre-hook's handle
        self.requests: LocalRequests | SharedRequests | None
        if self.world_size == 1:
            self.requests = LocalRequests()
        else:
            kv = store if store is not None else getattr(self.collective, "store", None)
            self.requests = (SharedRequests(kv, job_id, config.poll_every)
                             if kv is not None and config.poll_every > 0 else None)

    # -- save requests -------------------------------------------------------------------------

    def install_request_signal(self) -> None:
        """Make ``config.request_signal`` (SIGUSR1) request a save. Main thread only."""
        if self.config.request_signal is not None:
            signal.signal(self.config.request_signal, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._requested = True

    def request_save(self) -> None:
        self._requested = True

    def _request_file(self) -> None:
        if self.rank == 0 and self.config.request_file:
            try:
                os.unlink(self.root / self.config.request_file)
                self._requested = True
            except FileNotFoundError:
                pass

    def _local_request(self) -> bool:
        self._request_file()
        requested, self._requested = self._requested, False
        return requested

    def due(self, step: int) -> bool:
        """Save after this step? Periodic steps, or the step a request was scheduled for.
        Every rank must call it for every step. No collective: a request is passed on through
        the store, read on polling steps only (``RequestMissed``, a ``RuntimeError``, if the
        ranks are further apart than that allows)."""
        if self._outbox:
            self._flush_events()
        periodic = is_periodic(step, self.config.every_steps)
        poll = self.config.poll_every
        polling = poll > 0 and step % poll == 0
        requests = self.requests
        if requests is None:  # a collective without a store: agree with one all-reduce
            if polling:
                return self.collective.any(self._local_request()) or periodic
            return periodic
        if polling:
            self._request_file()
        if self._requested:
            self._requested = False
            requests.propose(step)
        pending = requests.poll(step) if polling else requests.pending
        if pending is not None and pending <= step:
            requests.taken(step)
            return True
        return periodic

    # -- save ----------------------------------------------------------------------------------

    def save(self, step: int, samples_consumed: int, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer, extra: dict[str, Any] | None = None) -> Valid | None:
        """Write this rank's part, then rank 0 commits the manifest. A collective: every rank
        calls it at the same step. Rank 0 returns the committed checkpoint; others None. With
        the ``dcp`` layout and ``async_save``, every rank returns None once the state is staged
        (``wait()`` returns the checkpoint on rank 0)."""
        t0 = time.perf_counter()
        if self._outbox:
            self._flush_events()
        if self.config.layout == mf.LAYOUT_DCP:
            return self._save_dcp(step, samples_consumed, model, optimizer, extra, t0)
        self.wait()
        self.wait_prune()
        directory = self.store.step_dir(step)
        directory.mkdir(exist_ok=True)
        files: dict[str, tuple[str, int, str]] = {}
        algorithm = self.config.file_checksum
        if self.rank == 0:
            module = getattr(model, "module", model)  # DistributedDataParallel -> its module
            state = {"model": module.state_dict(), "optimizer": optimizer.state_dict()}
            crc = torch.serialization.get_crc32_options()
            torch.serialization.set_crc32_options(self.config.torch_crc32)
            try:
                w = atomic_write(directory / STATE_FILE,
                                 lambda f: torch.save(state, cast(IO[bytes], f)), sync_dir=False,
                                 algorithm=algorithm)
            finally:
                torch.serialization.set_crc32_options(crc)
            files[STATE_FILE] = (w.digest, w.size, w.algorithm)
        w = atomic_write_bytes(directory / rank_file(self.rank),
                               self._rank_body(step, samples_consumed, extra), sync_dir=False,
                               algorithm=algorithm)
        files[rank_file(self.rank)] = (w.digest, w.size, w.algorithm)
        if self.rank != 0:  # this rank's renames are durable before rank 0 commits
            fsync_dir(directory)  # (rank 0's commit syncs the directory itself)
        gathered: list[dict[str, tuple[str, int, str]]] = self.collective.all_gather(files)
        self.last_stall_ms = (time.perf_counter() - t0) * 1000
        if self.rank != 0:
            return None
        valid = self._commit(step, samples_consumed, gathered, mf.LAYOUT_STATE_PT, t0)
        self._prune_in_background(step)
        return valid

    def _rank_body(self, step: int, samples_consumed: int, extra: dict[str, Any] | None) -> bytes:
        body = {"format": RANK_FORMAT, "job_id": self.job_id, "rank": self.rank,
                "world_size": self.world_size, "step": step,
                "samples_consumed": samples_consumed, "rng": rng.capture(),
                "extra": extra or {}}
        return json.dumps(body, separators=(",", ":")).encode()

    def _commit(self, step: int, samples_consumed: int,
                gathered: list[dict[str, tuple[str, int, str]]], layout: str,
                t0: float) -> Valid:
        """Rank 0: the manifest, last and atomically; then the ``written`` record."""
        directory = self.store.step_dir(step)
        entries = {name: mf.FileEntry(digest, size, algorithm)
                   for part in gathered for name, (digest, size, algorithm) in part.items()}
        manifest = mf.Manifest(job_id=self.job_id, step=step, samples_consumed=samples_consumed,
                               world_size=self.world_size, created_at=time.time_ns() // 1000,
                               files=entries, layout=layout)
        valid = self.store.commit(manifest)
        write_ms = (time.perf_counter() - t0) * 1000
        self.last_saved = valid
        self._emit("written", step, samples_consumed, directory, sha256=valid.manifest_sha256,
                   size_bytes=manifest.total_bytes, write_ms=write_ms)
        log.info("checkpoint written: step %d, %d bytes, %.1f ms, %s", step,
                 manifest.total_bytes, write_ms, directory)
        if self.config.verify_after_write:
            self._verify_emit(directory, step)
        return valid

    # -- sharded saves (torch.distributed.checkpoint) ------------------------------------------

    def _side(self) -> Any:
        side = getattr(self.collective, "side", None)
        if side is None:
            if self.world_size == 1:
                return Solo()
            raise ValueError("layout 'dcp': the collective needs a side() process group "
                             "(TorchCollective has one)")
        return side()

    def _save_dcp(self, step: int, samples_consumed: int, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, extra: dict[str, Any] | None,
                  t0: float) -> Valid | None:
        from trainguard_sdk.checkpoint import sharded

        self.wait()  # one save in flight: the previous one's failure is raised here
        self.wait_prune()
        side = self._side()
        directory = self.store.step_dir(step)
        directory.mkdir(exist_ok=True)
        body = self._rank_body(step, samples_consumed, extra)
        state = sharded.model_and_optimizer_state(model, optimizer)
        writer = sharded.HashingFileSystemWriter(directory, algorithm=self.config.file_checksum,
                                                 thread_count=self.config.write_threads)
        if not self.config.async_save:
            with sharded.crc32(self.config.torch_crc32):
                sharded.start_save(state, writer, group=side.group, stager=None)
            valid = self._finish_dcp(step, samples_consumed, body, writer.written(), side, t0)
            self.last_stall_ms = (time.perf_counter() - t0) * 1000
            if valid is not None:
                self._prune_in_background(step)
            return valid
        if self._stager is None:
            self._stager = sharded.ReusingStager()
        crc = sharded.crc32(self.config.torch_crc32)
        crc.__enter__()  # until the background write is done (see sharded.crc32)
        try:
            write = self._writer_of(state, writer, side, model, optimizer)
        except BaseException:
            crc.__exit__(None, None, None)
            raise
        job = _InFlight(step)

        def finish() -> None:
            self._background.active = True
            try:
                try:
                    write()
                finally:
                    crc.__exit__(None, None, None)
                job.result = self._finish_dcp(step, samples_consumed, body, writer.written(),
                                              side, t0)
                if job.result is not None:
                    for removed in self.store.prune(self.config.keep, step):
                        log.info("checkpoint removed (keep %d): %s", self.config.keep, removed)
            except BaseException as exc:  # raised on the training thread by the next call
                job.error = exc
                log.exception("checkpoint of step %d failed in the background", step)

        job.thread = threading.Thread(target=finish, name=f"tg-ckpt-save-{step}", daemon=True)
        self._inflight = job
        job.thread.start()
        self.last_stall_ms = (time.perf_counter() - t0) * 1000
        return None

    def _writer_of(self, state: dict[str, Any], writer: Any, side: Any,
                   model: torch.nn.Module, optimizer: torch.optim.Optimizer
                   ) -> Callable[[], object]:
        """What the save's thread runs to write ``state``. Staged here (DCP's async save: the
        copy is done before this returns), or with ``stage_in_background`` on that thread:
        the buffers are cloned here, the parameters and the optimizer state are copied there
        while the next forward and backward read them, and ``optimizer.step()`` waits until
        the copy is done before it changes them."""
        from trainguard_sdk.checkpoint import sharded

        stager = self._stager
        if not (self.config.stage_in_background and sharded.plain(state)):
            future = sharded.start_save(state, writer, group=side.group, stager=stager)
            return cast("Callable[[], object]", future.result)
        state = sharded.cloned_except(state, sharded.changed_by_step_only(model, optimizer))
        staged = self._staged = threading.Event()
        self.last_step_wait_ms = 0.0
        if id(optimizer) not in self._hooks:
            self._hooks[id(optimizer)] = optimizer.register_step_pre_hook(self._before_step)

        def write() -> None:
            try:
                snapshot = stager.stage(state)
            finally:
                staged.set()  # a failed copy must not hold the training thread
            sharded.start_save(snapshot, writer, group=side.group, stager=None)
        return write

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """The optimizer's step pre-hook: the parameters and its state change next, so the
        staging copy of the save in flight must be done."""
        staged = self._staged
        if staged is None or staged.is_set():
            return
        t0 = time.perf_counter()
        staged.wait()
        self.last_step_wait_ms = (self.last_step_wait_ms or 0.0) + (
            time.perf_counter() - t0) * 1000

    def _finish_dcp(self, step: int, samples_consumed: int, body: bytes,
                    files: dict[str, tuple[str, int, str]], side: Any,
                    t0: float) -> Valid | None:
        """After DCP's write: this rank's progress file, every rank's checksums to rank 0,
        rank 0 commits. A collective on ``side`` (every rank, the same save)."""
        directory = self.store.step_dir(step)
        part: tuple[str, Any]
        try:
            w = atomic_write_bytes(directory / rank_file(self.rank), body, sync_dir=False,
                                   algorithm=self.config.file_checksum)
            files[rank_file(self.rank)] = (w.digest, w.size, w.algorithm)
            fsync_dir(directory)  # this rank's files are durable before rank 0 commits
            part = ("ok", files)
        except OSError as exc:  # told to every rank, so that none waits for the others
            part = ("error", f"rank {self.rank}: {exc}")
        gathered: list[tuple[str, Any]] = side.all_gather(part)
        errors = [str(detail) for status, detail in gathered if status != "ok"]
        if errors:
            raise CheckpointWriteError(f"checkpoint of step {step}: {'; '.join(errors)}")
        if self.rank != 0:
            return None
        return self._commit(step, samples_consumed, [detail for _, detail in gathered],
                            mf.LAYOUT_DCP, t0)

    def wait(self) -> Valid | None:
        """Wait for the save in flight, if any: rank 0 gets the committed checkpoint.
        ``CheckpointWriteError`` when it failed (on any rank)."""
        job, self._inflight = self._inflight, None
        if job is not None and job.thread is not None:
            job.thread.join()
        if self._outbox:
            self._flush_events()
        if job is None:
            return None
        if job.error is not None:
            if isinstance(job.error, OSError):
                raise job.error
            raise CheckpointWriteError(
                f"checkpoint of step {job.step}: {type(job.error).__name__}: {job.error}"
            ) from job.error
        return job.result

    def _prune_in_background(self, newest: int) -> None:
        """Remove old checkpoints off the training thread (deleting a large file costs tens
        of ms); the next save, resume or ``close`` waits for it first."""
        self.wait_prune()

        def prune() -> None:
            try:
                for removed in self.store.prune(self.config.keep, newest):
                    log.info("checkpoint removed (keep %d): %s", self.config.keep, removed)
            except OSError:
                log.exception("pruning old checkpoints failed; the next save tries again")

        self._pruner = threading.Thread(target=prune, name="tg-ckpt-prune", daemon=True)
        self._pruner.start()

    def wait_prune(self) -> None:
        pruner, self._pruner = self._pruner, None
        if pruner is not None:
            pruner.join()

    def close(self) -> None:
        """Wait for background work (a save in flight, pruning); a background save's failure
        is raised here. The manager stays usable."""
        try:
            self.wait()
        finally:
            self.wait_prune()
            for handle in self._hooks.values():  # stage_in_background's step pre-hooks
                handle.remove()
            self._hooks.clear()

    # -- resume --------------------------------------------------------------------------------

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Restored | None:
        """Load the newest checkpoint every rank finds valid into ``model`` and ``optimizer``
        and restore this rank's RNG states (call it last before the loop). None when there is
        none (a fresh start). A collective. ``CorruptFile`` if the chosen checkpoint changed
        between verification and loading; ``CheckpointIncompatible`` for another world size
        or job."""
        self.wait()
        self.wait_prune()
        mine = [s for s, _ in self.store.steps()]
        everyone = self.collective.all_gather(mine)
        common = set(mine).intersection(*map(set, everyone))
        chosen: Valid | None = None
        refused: list[Path] = []
        skipped: list[str] = []
        for step in sorted(common, reverse=True):
            path = self.store.step_dir(step)
            outcome = self.store.verify(path, step, share=(self.rank, self.world_size))
            verdicts: list[bool] = self.collective.all_gather(isinstance(outcome, Valid))
            if isinstance(outcome, Valid) and all(verdicts):
                self._emit("verified", step, outcome.manifest.samples_consumed, path,
                           sha256=outcome.manifest_sha256, size_bytes=outcome.manifest.total_bytes)
                chosen = outcome
                break
            if isinstance(outcome, Invalid):
                reason = outcome.reason
                if outcome.committed:
                    self._emit("corrupt", step, outcome.samples_consumed, path, reason=reason)
                    log.warning("checkpoint corrupt, skipped: %s: %s", path, reason)
                else:
                    log.warning("checkpoint never committed, skipped: %s: %s", path, reason)
            else:
                bad = [r for r, ok in enumerate(verdicts) if not ok]
                reason = f"found invalid by rank(s) {bad}"
                log.warning("checkpoint %s valid here but %s", path, reason)
            skipped.append(f"{path.name}: {reason}")
            refused.append(path)
        if self.rank == 0:
            for path in refused:
                target = self.store.quarantine(path, self.config.keep)
                log.warning("checkpoint moved aside: %s -> %s", path, target)
        if chosen is None:
            return None
        return self._load(chosen, model, optimizer, skipped)

    def _load(self, chosen: Valid, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              skipped: list[str]) -> Restored:
        m = chosen.manifest
        if m.world_size != self.world_size:
            raise CheckpointIncompatible(
                f"world_size: {chosen.path} was written by {m.world_size} ranks, this job has "
                f"{self.world_size}")
        if m.job_id != self.job_id:
            raise CheckpointIncompatible(f"job_id: {chosen.path} belongs to job {m.job_id!r}, "
                                         f"this is {self.job_id!r}")
        if m.layout == mf.LAYOUT_DCP:
            body = self._load_dcp(chosen, model, optimizer)
        else:
            raw_state = self.store.read_verified(chosen, STATE_FILE)
            state = torch.load(io.BytesIO(raw_state), map_location="cpu", weights_only=True)
            body = self._read_rank_body(chosen)
            module = getattr(model, "module", model)
            module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        restored_rng = rng.restore(body.get("rng") or {})
        self._emit("loaded", m.step, m.samples_consumed, chosen.path,
                   sha256=chosen.manifest_sha256, size_bytes=m.total_bytes)
        log.info("checkpoint loaded: step %d, samples %d, %s", m.step, m.samples_consumed,
                 chosen.path)
        return Restored(Progress(m.step, m.samples_consumed), chosen.path,
                        chosen.manifest_sha256, dict(body.get("extra") or {}), restored_rng,
                        skipped)

    def _read_rank_body(self, chosen: Valid) -> dict[str, Any]:
        m = chosen.manifest
        body: dict[str, Any] = json.loads(self.store.read_verified(chosen, rank_file(self.rank)))
        if body.get("step") != m.step or body.get("samples_consumed") != m.samples_consumed:
            raise CorruptFile(f"{rank_file(self.rank)}: progress differs from the manifest")
        return body

    def _load_dcp(self, chosen: Valid, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """Every rank reads its progress file, they agree that all could (so that none is
        left alone in DCP's load), then DCP loads the shards (a collective)."""
        from trainguard_sdk.checkpoint import sharded

        side = self._side()
        body: dict[str, Any] = {}
        problem: str | None = None
        try:
            body = self._read_rank_body(chosen)
        except (CorruptFile, ValueError) as exc:
            problem = f"rank {self.rank}: {exc}"
        problems = [p for p in side.all_gather(problem) if p is not None]
        if problems:
            raise CorruptFile("; ".join(problems))
        sharded.load_into(chosen.path, model, optimizer, group=side.group)
        return body

    # -- events --------------------------------------------------------------------------------

    def _verify_emit(self, path: Path, step: int) -> None:
        outcome = self.store.verify(path, step)
        if isinstance(outcome, Valid):
            self._emit("verified", step, outcome.manifest.samples_consumed, path,
                       sha256=outcome.manifest_sha256, size_bytes=outcome.manifest.total_bytes)
        else:
            self._emit("corrupt", step, outcome.samples_consumed, path, reason=outcome.reason)

    def _emit(self, action: str, step: int, samples_consumed: int, path: Path, *,
              sha256: str | None = None, size_bytes: int | None = None,
              write_ms: float | None = None, reason: str | None = None) -> None:
        if self.sink is None:
            return
        if getattr(self._background, "active", False):
            # a background save: the sink is the training thread's (it shares the step
            # reports' socket); sent from there at the next due/save/wait/close
            self._outbox.append((action, step, samples_consumed, path,
                                 {"sha256": sha256, "size_bytes": size_bytes,
                                  "write_ms": write_ms, "reason": reason}))
            return
        self._send(action, step, samples_consumed, path, sha256=sha256, size_bytes=size_bytes,
                   write_ms=write_ms, reason=reason)

    def _flush_events(self) -> None:
        while self._outbox:
            action, step, samples, path, kw = self._outbox.popleft()
            self._send(action, step, samples, path, **kw)

    def _send(self, action: str, step: int, samples_consumed: int, path: Path, *,
              sha256: str | None = None, size_bytes: int | None = None,
              write_ms: float | None = None, reason: str | None = None) -> None:
        if self.sink is None:
            return
        try:
            self.sink.checkpoint(action, step, samples_consumed, str(path), sha256=sha256,
                                 size_bytes=size_bytes, write_ms=write_ms, reason=reason)
        except Exception:  # a sink must not raise; if one does, checkpoints still work
            log.exception("checkpoint sink failed for %s %s", action, path)
