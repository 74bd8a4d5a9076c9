"""The checkpoint directory on disk: one sub-directory per checkpoint, named by its step;
committed by its manifest; verified file by file; the last K kept. Torch-free.

    <root>/
      step-000000000120/          a checkpoint: committed once MANIFEST.json is in place
        state.pt                  model + optimizer (written by rank 0), or, with the
        __0_0.distcp, .metadata   dcp layout, each rank's shard and DCP's metadata
        rank-00000.json           progress + RNG states of rank 0
        rank-00001.json           ... of rank 1
        MANIFEST.json             written last, atomically: sha256 and size of every file
      quarantine/                 corrupt or never-committed checkpoints set aside at resume
      SAVE_NOW                    a save request (see ``manager.py``)

Verification returns outcome values (``Valid`` / ``Invalid``), never raises for bad data.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Union

from trainguard_sdk.checkpoint import checksum
from trainguard_sdk.checkpoint import manifest as mf
from trainguard_sdk.checkpoint.atomic import atomic_write_bytes, fsync_dir

STEP_DIR_RE: Final = re.compile(r"^step-(\d{12})$")
QUARANTINE: Final = "quarantine"


@dataclass(frozen=True)
class Valid:
    path: Path
    manifest: mf.Manifest
    manifest_sha256: str  # of MANIFEST.json's bytes: the checkpoint's identity in events


@dataclass(frozen=True)
class Invalid:
    path: Path
    step: int
    reason: str
    committed: bool  # False: no manifest (the save never finished), not a corruption
    samples_consumed: int = 0  # from the manifest when it could be read, else 0


Verification = Union[Valid, Invalid]


class CorruptFile(ValueError):
    """A file whose bytes do not match the manifest (read for loading)."""


def step_dir_name(step: int) -> str:
    return f"step-{step:012d}"


class CheckpointStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def step_dir(self, step: int) -> Path:
        return self.root / step_dir_name(step)

    def steps(self) -> list[tuple[int, Path]]:
        """Every checkpoint directory (committed or not), oldest first."""
        out: list[tuple[int, Path]] = []
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return out
        for entry in entries:
            m = STEP_DIR_RE.match(entry.name)
            if m and entry.is_dir(follow_symlinks=False):
                out.append((int(m.group(1)), Path(entry.path)))
        return sorted(out)

    # -- verification ------------------------------------------------------------------------

    def verify(self, path: Path, step: int | None = None,
               share: tuple[int, int] | None = None) -> Verification:
        """Check the manifest, then every file it lists: present, same size, same SHA-256.
        ``share=(rank, world_size)``: for a sharded (``dcp``) checkpoint, check only every
        world_size-th file from ``rank`` on (the ranks then agree on the verdicts: every file
        is read once); other layouts are checked whole."""
        if step is None:
            m = STEP_DIR_RE.match(path.name)
            step = int(m.group(1)) if m else 0
        try:
            raw = (path / mf.MANIFEST_NAME).read_bytes()
        except FileNotFoundError:
            return Invalid(path, step, f"no {mf.MANIFEST_NAME}: the save never finished",
                           committed=False)
        except OSError as exc:
            return Invalid(path, step, f"{mf.MANIFEST_NAME}: unreadable ({exc})", True)
        try:
            manifest = mf.decode(raw)
        except mf.ManifestError as exc:
            return Invalid(path, step, f"{mf.MANIFEST_NAME}: {exc}", True)
        if manifest.step != step:
            return Invalid(path, step, f"{mf.MANIFEST_NAME}: step {manifest.step} in a "
                                       f"directory named for step {step}", True)
        names = sorted(manifest.files)
        if share is not None and manifest.layout == mf.LAYOUT_DCP:
            rank, world = share
            names = names[rank::world]
        for name in names:
            entry = manifest.files[name]
            problem = _check_file(path / name, entry)
            if problem is not None:
                return Invalid(path, step, f"{name}: {problem}", True, manifest.samples_consumed)
        return Valid(path, manifest, hashlib.sha256(raw).hexdigest())

    def read_verified(self, valid: Valid, name: str) -> bytes:
        """A listed file's bytes, checked again against the manifest as they are read (the
        bytes loaded are the bytes checked). ``CorruptFile`` if they no longer match."""
        entry = valid.manifest.files.get(name)
        if entry is None:
            raise CorruptFile(f"{name}: not in the manifest of {valid.path}")
        try:
            data = (valid.path / name).read_bytes()
        except OSError as exc:
            raise CorruptFile(f"{name}: unreadable ({exc})") from None
        if len(data) != entry.size:
            raise CorruptFile(f"{name}: {len(data)} bytes, the manifest says {entry.size}")
        h = checksum.new(entry.algorithm)
        h.update(data)
        if h.hexdigest() != entry.digest:
            raise CorruptFile(f"{name}: {entry.algorithm} does not match the manifest")
        return data

    # -- writing -----------------------------------------------------------------------------

    def commit(self, manifest: mf.Manifest) -> Valid:
        """Write the manifest last, atomically: the checkpoint exists from here on."""
        path = self.step_dir(manifest.step)
        fsync_dir(path)  # the data files' renames are durable before the manifest's
        written = atomic_write_bytes(path / mf.MANIFEST_NAME, mf.encode(manifest))
        fsync_dir(self.root)
        return Valid(path, manifest, written.digest)

    def prune(self, keep: int, newest_committed: int) -> list[Path]:
        """Keep the ``keep`` newest committed checkpoints; remove older committed ones and
        uncommitted ones older than ``newest_committed``. Returns what was removed."""
        removed: list[Path] = []
        committed = [(s, p) for s, p in self.steps() if (p / mf.MANIFEST_NAME).exists()]
        kept = {p for _, p in committed[-keep:]} if keep > 0 else set()
        for step, path in self.steps():
            if path in kept or step > newest_committed:  # newer: another save in flight
                continue
            # the manifest first: a removal cut short leaves an uncommitted directory,
            # never a committed one with files missing
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path / mf.MANIFEST_NAME)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        if removed:
            fsync_dir(self.root)
        return removed

    def quarantine(self, path: Path, keep: int) -> Path | None:
        """Move a corrupt or uncommitted checkpoint aside (kept as evidence, the ``keep``
        newest), so that a new save of the same step starts from an empty directory."""
        qdir = self.root / QUARANTINE
        qdir.mkdir(exist_ok=True)
        target = qdir / f"{path.name}-{time.time_ns()}"
        try:
            os.replace(path, target)
        except FileNotFoundError:
            return None
        fsync_dir(self.root)
        old = sorted(qdir.iterdir(), key=lambda p: p.name)
        for extra in old[:-keep] if keep > 0 else old:
            shutil.rmtree(extra, ignore_errors=True)
        with contextlib.suppress(OSError):
            fsync_dir(qdir)
        return target


def _check_file(path: Path, entry: mf.FileEntry) -> str | None:
    try:
        digest, size = checksum.file_digest(path, entry.algorithm)
    except FileNotFoundError:
        return "missing"
    except OSError as exc:
        return f"unreadable ({exc})"
    if size != entry.size:
        return f"{size} bytes, the manifest says {entry.size}"
    if digest != entry.digest:
        return f"{entry.algorithm} does not match the manifest"
    return None
