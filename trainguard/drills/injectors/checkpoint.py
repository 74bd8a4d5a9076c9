"""Checkpoint corruption on disk: the newest committed checkpoint's largest data file is
truncated to half or has one bit flipped in its middle, leaving the manifest alone (so only a
checksum can tell). ``restore_copy`` puts the original bytes back on undo."""

from __future__ import annotations

import hashlib
import os
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
    def __init__(self, root: Path, mode: str = "bitflip", keep_copy: bool = False) -> None:
        self.root, self.mode, self.keep_copy = root, mode, keep_copy
        self.original: tuple[Path, bytes] | None = None

    def inject(self) -> Acted:
        newest = newest_committed(self.root)
        if newest is None:
            raise InjectionError(f"{self.root}: no committed checkpoint to corrupt")
        step, path = newest
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
            self.original = (victim, data)
        return Acted.now(step=step, file=str(victim), mode=self.mode, offset=at,
                         size_before=len(data), size_after=len(bad),
                         sha256_before=hashlib.sha256(data).hexdigest(),
                         sha256_after=hashlib.sha256(bad).hexdigest())

    def undo(self) -> Acted:
        if self.original is None:
            return Acted.now(undo="none: the corrupt checkpoint stays (quarantined by resume)")
        path, data = self.original
        self.original = None
        if not path.parent.exists():
            return Acted.now(file=str(path), undo="its checkpoint directory is gone")
        path.write_bytes(data)
        return Acted.now(file=str(path), restored_bytes=len(data))
