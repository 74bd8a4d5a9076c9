"""Checkpoint corruption on disk: the newest committed checkpoint's largest data file is
truncated to half or has one bit flipped in its middle, leaving the manifest alone (so only a
checksum can tell). ``restore_copy`` puts the original bytes back on undo."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from trainguard_sdk.checkpoint.manifest import MANIFEST_NAME
from trainguard_sdk.checkpoint.store import STEP_DIR_RE

from trainguard.drills.injectors.base import Acted, InjectionError


def newest_committed(root: Path) -> tuple[int, Path] | None:
    found = []
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return None
    for entry in entries:
        m = STEP_DIR_RE.match(entry.name)
        if m and (Path(entry.path) / MANIFEST_NAME).is_file():
            found.append((int(m.group(1)), Path(entry.path)))
    return max(found) if found else None


def corrupt_bytes(data: bytes, mode: str) -> tuple[bytes, int]:
    """The corrupted bytes and the offset where they differ. Pure."""
    if not data:
        raise InjectionError("an empty file cannot be corrupted further")
    if mode == "truncate":
        return data[: len(data) // 2], len(data) // 2
    if mode == "bitflip":
        at = len(data) // 2
        return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:], at
    raise InjectionError(f"mode: truncate or bitflip (got {mode!r})")


class CorruptNewest:
    """Corrupts the newest committed checkpoint. A save in flight when ``inject`` runs can
    commit a newer one just after (a 2026-12-06 drill run: step 20 corrupted as step 30
    committed, and the resume found nothing wrong); ``after_trigger`` corrupts those too, so
    the newest checkpoint the resume sees is always a corrupt one."""

    def __init__(self, root: Path, mode: str = "bitflip", keep_copy: bool = False) -> None:
        self.root, self.mode, self.keep_copy = root, mode, keep_copy
        self.originals: list[tuple[Path, bytes]] = []
        self.step: int | None = None  # the newest step corrupted

    def inject(self) -> Acted:
        newest = newest_committed(self.root)
        if newest is None:
            raise InjectionError(f"{self.root}: no committed checkpoint to corrupt")
        return self._corrupt(*newest)

    def after_trigger(self, settle_s: float = 3.0, poll_s: float = 0.2) -> list[Acted]:
        """Watches ``settle_s`` after the trigger (the job can no longer start a save, one
        already writing can still commit) and corrupts each checkpoint committed after the
        one ``inject`` corrupted."""
        done: list[Acted] = []
        deadline = time.monotonic() + settle_s
        while True:
            newest = newest_committed(self.root)
            if newest is not None and self.step is not None and newest[0] > self.step:
                done.append(self._corrupt(*newest))
            if time.monotonic() >= deadline:
                return done
            time.sleep(poll_s)

    def _corrupt(self, step: int, path: Path) -> Acted:
        files = [p for p in path.iterdir() if p.is_file() and p.name != MANIFEST_NAME]
        if not files:
            raise InjectionError(f"{path}: no data file")
        victim = max(files, key=lambda p: (p.stat().st_size, p.name))
        data = victim.read_bytes()
        bad, at = corrupt_bytes(data, self.mode)
        with open(victim, "r+b") as fh:  # in place: same inode, as a disk error would be
            fh.seek(0)
            fh.write(bad)
            fh.truncate(len(bad))
            fh.flush()
            os.fsync(fh.fileno())
        if self.keep_copy:
            self.originals.append((victim, data))
        self.step = step
        return Acted.now(step=step, file=str(victim), mode=self.mode, offset=at,
                         size_before=len(data), size_after=len(bad),
                         sha256_before=hashlib.sha256(data).hexdigest(),
                         sha256_after=hashlib.sha256(bad).hexdigest())

    def undo(self) -> Acted:
        if not self.originals:
            return Acted.now(undo="none: the corrupt checkpoint stays (quarantined by resume)")
        restored, gone = 0, 0
        for path, data in self.originals:
            if path.parent.exists():
                path.write_bytes(data)
                restored += len(data)
            else:
                gone += 1
        files = ",".join(str(p) for p, _ in self.originals)
        self.originals = []
        return Acted.now(file=files, restored_bytes=restored, directories_gone=gone)
