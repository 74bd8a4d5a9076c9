"""Durable, atomic file writes: a temp file in the target's directory, written through a
checksum (``checksum.py``: SHA-256 by default), fsync'd, renamed over the target, and the
directory fsync'd, so a crash leaves either the old file or the new one, never a torn one.
Torch-free."""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import sys
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final, cast

from trainguard_sdk.checkpoint import checksum
from trainguard_sdk.checkpoint.checksum import SHA256
from trainguard_sdk.wire import Bytes

SYNC_EVERY: Final = 8 << 20  # start writing back every 8 MiB (0: only the final fsync)
PARALLEL_HASH_MIN: Final = 1 << 20  # hash pieces this large on a helper thread


@dataclass(frozen=True)
class WrittenFile:
    path: Path
    digest: str  # hex, of ``algorithm``
    size: int
    algorithm: str = SHA256


SYNC_FILE_RANGE_WRITE: Final = 2


def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """Linux's sync_file_range(2) through libc, or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return cast(Callable[[int, int, int, int], int], fn)


_SYNC_FILE_RANGE: Final = _sync_file_range()


class HashingWriter:
    """A write-only binary file that hashes what goes through it (``torch.save`` and
    ``json`` write to it directly: no second pass over the bytes).

    Two overlaps keep a large checkpoint close to the speed of a plain write + fsync:
    a large piece is hashed on a helper thread while it is written (both release the GIL),
    and every ``sync_every`` bytes the kernel is asked to start writing back what is already
    in the page cache (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait; a
    background ``fdatasync`` where that call is missing), so the final fsync waits for the
    tail instead of the whole file after serialisation and hashing are done. The final fsync
    is what makes the file durable; the early write-back only moves work earlier."""

    def __init__(self, fd: int, *, sync_every: int = SYNC_EVERY,
                 algorithm: str = SHA256) -> None:
        self._fd = fd
        self.algorithm = algorithm
        self._hash = checksum.new(algorithm)
        self.size = 0
        self._sync_every = sync_every
        self._unsynced = 0
        self._pool: ThreadPoolExecutor | None = None
        self._syncing: Future[None] | None = None

    def write(self, data: Bytes) -> int:
        view = memoryview(data).cast("B")
        n = len(view)
        if n >= PARALLEL_HASH_MIN:
            hashed = self._executor().submit(self._hash.update, view)
            self._write_all(view)
            hashed.result()
        else:
            self._hash.update(view)
            self._write_all(view)
        self.size += n
        self._unsynced += n
        if self._sync_every and self._unsynced >= self._sync_every:
            if _SYNC_FILE_RANGE is not None:  # start write-back, do not wait for it
                self._unsynced = 0
                _SYNC_FILE_RANGE(self._fd, 0, 0, SYNC_FILE_RANGE_WRITE)
            elif self._syncing is None or self._syncing.done():
                self._unsynced = 0
                self._syncing = self._executor().submit(os.fdatasync, self._fd)
        return n

    def _write_all(self, view: memoryview) -> None:
        written = 0
        n = len(view)
        while written < n:
            written += os.write(self._fd, view[written:])

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tg-ckpt-io")
        return self._pool

    def flush(self) -> None:
        """Nothing is buffered: every write goes straight to the fd."""

    def close(self) -> None:
        """Wait for the helper threads (a background sync's error is raised here)."""
        syncing, self._syncing = self._syncing, None
        pool, self._pool = self._pool, None
        try:
            if syncing is not None:
                syncing.result()
        finally:
            if pool is not None:
                pool.shutdown(wait=True)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[HashingWriter], object],
                 *, sync_dir: bool = True, algorithm: str = SHA256) -> WrittenFile:
    """Write ``path`` atomically and durably through ``write(writer)``; the checksum
    (``algorithm``) and size of what was written. On any error the temp file is removed and
    the target is untouched. ``sync_dir=False`` leaves the directory fsync to the caller
    (one for many files)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    writer = HashingWriter(fd, algorithm=algorithm)
    try:
        try:
            write(writer)
        finally:
            writer.close()
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync_dir:
        fsync_dir(path.parent)
    return WrittenFile(path, writer.hexdigest(), writer.size, algorithm)


def atomic_write_bytes(path: Path, data: Bytes, *, sync_dir: bool = True,
                       algorithm: str = SHA256) -> WrittenFile:
    return atomic_write(path, lambda w: w.write(data), sync_dir=sync_dir, algorithm=algorithm)


file_digest = checksum.file_digest
