"""Atomic, durable writes: content and digest, fsync before rename, directory fsync after,
and an error that leaves the old file and no temp file behind."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from trainguard_sdk.checkpoint import atomic
from trainguard_sdk.checkpoint.atomic import atomic_write, atomic_write_bytes, file_digest


def test_writes_content_and_reports_its_digest(tmp_path: Path) -> None:
    data = os.urandom(3 << 20) + b"tail"
    got = atomic_write_bytes(tmp_path / "f.bin", data)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert got.digest == hashlib.sha256(data).hexdigest()
    assert got.size == len(data)
    assert file_digest(tmp_path / "f.bin") == (got.digest, got.size)
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]


def test_streamed_writes_hash_every_piece(tmp_path: Path) -> None:
    pieces: list[bytes | bytearray | memoryview] = [b"a" * 10, bytearray(b"b" * 5000),
                                                    memoryview(b"c" * 70000)]

    def write(w: atomic.HashingWriter) -> None:
        for p in pieces:
            w.write(p)

    got = atomic_write(tmp_path / "x", write)
    whole = b"".join(bytes(p) for p in pieces)
    assert got.digest == hashlib.sha256(whole).hexdigest() and got.size == len(whole)


def test_fsync_file_then_rename_then_fsync_dir(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        calls.append("fsync-dir" if os.path.isdir(target) else "fsync-file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)  # the module atomic calls through
    monkeypatch.setattr(os, "replace", replace)
    atomic_write_bytes(tmp_path / "f", b"data")
    assert calls == ["fsync-file", "rename", "fsync-dir"]
    calls.clear()
    atomic_write_bytes(tmp_path / "g", b"data", sync_dir=False)
    assert calls == ["fsync-file", "rename"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "state"
    atomic_write_bytes(target, b"old")

    def boom(w: atomic.HashingWriter) -> None:
        w.write(b"half of the new")
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        atomic_write(target, boom)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


@pytest.mark.parametrize("how", ["sync_file_range", "fdatasync-thread"])
def test_early_writeback_and_parallel_hashing_keep_the_digest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    started: list[int] = []
    real_sfr = atomic._SYNC_FILE_RANGE
    real_fdatasync = os.fdatasync
    if how == "sync_file_range":
        assert real_sfr is not None  # Linux

        def sfr(fd: int, off: int, n: int, flags: int) -> int:
            started.append(fd)
            return real_sfr(fd, off, n, flags)

        monkeypatch.setattr(atomic, "_SYNC_FILE_RANGE", sfr)
    else:
        def fdatasync(fd: int) -> None:
            started.append(fd)
            real_fdatasync(fd)

        monkeypatch.setattr(atomic, "_SYNC_FILE_RANGE", None)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
    pieces = [os.urandom(n) for n in (3 << 20, 100, 2 << 20, 5 << 20, 7)]
    fd = os.open(tmp_path / "big", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        writer = atomic.HashingWriter(fd, sync_every=1 << 20)
        for p in pieces:
            writer.write(p)
        writer.close()
    finally:
        os.close(fd)
    whole = b"".join(pieces)
    assert writer.hexdigest() == hashlib.sha256(whole).hexdigest()
    assert writer.size == len(whole) and (tmp_path / "big").read_bytes() == whole
    assert started and set(started) == {fd}  # write-back started before the final fsync
