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
the file ``<directory>/SAVE_NOW`` (``request_file``; rank 0 consumes it). Every rank then
saves at the same step: ``due()`` agrees on pending requests with one one-integer collective
every ``poll_every`` steps (a MAX all-reduce; ~0.1 ms on gloo over loopback). ``request_save()``
is the same from code.

What a checkpoint holds: ``state.pt`` (``torch.save`` of the model's and the optimizer's
state dicts, written by rank 0: data-parallel ranks hold the same ones) and one
``rank-NNNNN.json`` per rank (step, samples consumed, the RNG states of Python, NumPy when
imported, torch and CUDA, and the caller's ``extra``), then ``MANIFEST.json`` (see
``manifest.py`` / ``store.py``). Every file is written to a temp file, fsync'd, renamed, and
the directory fsync'd; the manifest goes last, so a crash mid-save leaves no checkpoint, never
a torn one. The directory must be shared by every rank (one file system).

Resume: the ranks list the checkpoints, newest first; each verifies the candidate fully
(manifest checksum, every file's size and SHA-256) and they agree (all ranks must find it
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
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final, Protocol, cast

import torch

from trainguard_sdk.checkpoint import manifest as mf
from trainguard_sdk.checkpoint import rng
from trainguard_sdk.checkpoint.atomic import atomic_write, atomic_write_bytes, fsync_dir
from trainguard_sdk.checkpoint.collective import Collective, Solo
from trainguard_sdk.checkpoint.location import durable_directory
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


@dataclass(frozen=True)
class CheckpointConfig:
    directory: Path
    every_steps: int = 0  # 0: only on command
    keep: int = 3
    allow_tmp: bool = False
    request_signal: int | None = signal.SIGUSR1
    request_file: str | None = "SAVE_NOW"
    poll_every: int = 1  # steps between agreements on save requests; 0 = never poll
    verify_after_write: bool = False
    # torch.save's per-record CRC32 duplicates the manifest's SHA-256 and costs as much as the
    # hash: off by default (torch.load reads such files the same).
    torch_crc32: bool = False
    # How errors name the settings (the CLI passes its flags).
    setting_names: tuple[str, str] = ("directory", "allow_tmp")

    def __post_init__(self) -> None:
        for name in ("every_steps", "poll_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: >= 0, got {getattr(self, name)!r}")
        if self.keep < 1:
            raise ValueError(f"keep: >= 1, got {self.keep!r}")


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


class CheckpointManager:
    def __init__(self, config: CheckpointConfig, *, job_id: str,
                 collective: Collective | None = None, sink: CheckpointSink | None = None) -> None:
        """``CheckpointLocationError`` when the directory is a scratch one and not allowed."""
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
        self.last_saved: Valid | None = None

    # -- save requests -------------------------------------------------------------------------

    def install_request_signal(self) -> None:
        """Make ``config.request_signal`` (SIGUSR1) request a save. Main thread only."""
        if self.config.request_signal is not None:
            signal.signal(self.config.request_signal, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._requested = True

    def request_save(self) -> None:
        self._requested = True

    def _local_request(self) -> bool:
        if self.rank == 0 and self.config.request_file:
            req = self.root / self.config.request_file
            try:
                os.unlink(req)
                self._requested = True
            except FileNotFoundError:
                pass
        requested, self._requested = self._requested, False
        return requested

    def due(self, step: int) -> bool:
        """Save after this step? Periodic steps, or a request any rank saw (agreed with one
        small collective on polling steps: every rank must call ``due`` for every step)."""
        periodic = self.config.every_steps > 0 and step % self.config.every_steps == 0
        poll = self.config.poll_every
        if poll and step % poll == 0:
            requested = self._local_request()
            agreed = self.collective.any(requested) if self.world_size > 1 else requested
            return periodic or agreed
        return periodic

    # -- save ----------------------------------------------------------------------------------

    def save(self, step: int, samples_consumed: int, model: torch.nn.Module,
             optimizer: torch.optim.Optimizer, extra: dict[str, Any] | None = None) -> Valid | None:
        """Write this rank's part, then rank 0 commits the manifest. A collective: every rank
        calls it at the same step. Rank 0 returns the committed checkpoint; others None."""
        t0 = time.perf_counter()
        self.wait_prune()
        directory = self.store.step_dir(step)
        directory.mkdir(exist_ok=True)
        files: dict[str, tuple[str, int]] = {}
        if self.rank == 0:
            module = getattr(model, "module", model)  # DistributedDataParallel -> its module
            state = {"model": module.state_dict(), "optimizer": optimizer.state_dict()}
            crc = torch.serialization.get_crc32_options()
            torch.serialization.set_crc32_options(self.config.torch_crc32)
            try:
                w = atomic_write(directory / STATE_FILE,
                                 lambda f: torch.save(state, cast(IO[bytes], f)), sync_dir=False)
            finally:
                torch.serialization.set_crc32_options(crc)
            files[STATE_FILE] = (w.sha256, w.size)
        body = {"format": RANK_FORMAT, "job_id": self.job_id, "rank": self.rank,
                "world_size": self.world_size, "step": step,
                "samples_consumed": samples_consumed, "rng": rng.capture(),
                "extra": extra or {}}
        w = atomic_write_bytes(directory / rank_file(self.rank),
                               json.dumps(body, separators=(",", ":")).encode(), sync_dir=False)
        files[rank_file(self.rank)] = (w.sha256, w.size)
        if self.rank != 0:  # this rank's renames are durable before rank 0 commits
            fsync_dir(directory)  # (rank 0's commit syncs the directory itself)
        gathered: list[dict[str, tuple[str, int]]] = self.collective.all_gather(files)
        if self.rank != 0:
            return None
        entries = {name: mf.FileEntry(sha, size)
                   for part in gathered for name, (sha, size) in part.items()}
        manifest = mf.Manifest(job_id=self.job_id, step=step, samples_consumed=samples_consumed,
                               world_size=self.world_size, created_at=time.time_ns() // 1000,
                               files=entries)
        valid = self.store.commit(manifest)
        write_ms = (time.perf_counter() - t0) * 1000
        self.last_saved = valid
        self._emit("written", step, samples_consumed, directory, sha256=valid.manifest_sha256,
                   size_bytes=manifest.total_bytes, write_ms=write_ms)
        log.info("checkpoint written: step %d, %d bytes, %.1f ms, %s", step,
                 manifest.total_bytes, write_ms, directory)
        if self.config.verify_after_write:
            self._verify_emit(directory, step)
        self._prune_in_background(step)
        return valid

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
        """Wait for background work (pruning). The manager stays usable."""
        self.wait_prune()

    # -- resume --------------------------------------------------------------------------------

    def resume(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Restored | None:
        """Load the newest checkpoint every rank finds valid into ``model`` and ``optimizer``
        and restore this rank's RNG states (call it last before the loop). None when there is
        none (a fresh start). A collective. ``CorruptFile`` if the chosen checkpoint changed
        between verification and loading; ``CheckpointIncompatible`` for another world size
        or job."""
        self.wait_prune()
        mine = [s for s, _ in self.store.steps()]
        everyone = self.collective.all_gather(mine)
        common = set(mine).intersection(*map(set, everyone))
        chosen: Valid | None = None
        refused: list[Path] = []
        skipped: list[str] = []
        for step in sorted(common, reverse=True):
            path = self.store.step_dir(step)
            outcome = self.store.verify(path, step)
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
        raw_state = self.store.read_verified(chosen, STATE_FILE)
        state = torch.load(io.BytesIO(raw_state), map_location="cpu", weights_only=True)
        body = json.loads(self.store.read_verified(chosen, rank_file(self.rank)))
        if body.get("step") != m.step or body.get("samples_consumed") != m.samples_consumed:
            raise CorruptFile(f"{rank_file(self.rank)}: progress differs from the manifest")
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
        try:
            self.sink.checkpoint(action, step, samples_consumed, str(path), sha256=sha256,
                                 size_bytes=size_bytes, write_ms=write_ms, reason=reason)
        except Exception:  # a sink must not raise; if one does, checkpoints still work
            log.exception("checkpoint sink failed for %s %s", action, path)
