"""Where checkpoints may live: a durable location, not a scratch one. Paths under ``/tmp``,
``/var/tmp``, ``/dev/shm``, the process's temp dir, or on a tmpfs/ramfs mount are refused
unless the caller allows it explicitly (the workload's ``--allow-tmp-ckpt``,
``CheckpointConfig.allow_tmp``): a checkpoint there does not survive the node. Torch-free."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Final

SCRATCH_DIRS: Final = ("/tmp", "/var/tmp", "/dev/shm")
VOLATILE_FS: Final = frozenset({"tmpfs", "ramfs"})
MOUNTINFO: Final = Path("/proc/self/mountinfo")


class CheckpointLocationError(ValueError):
    """The configured checkpoint directory is not acceptable; the message names the setting."""


def _mount_of(path: Path, mountinfo: Path) -> tuple[str, str] | None:
    """(mount point, fs type) of the deepest mount holding ``path``, from mountinfo."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    best: tuple[str, str] | None = None
    target = str(path)
    for line in lines:
        left, sep, right = line.partition(" - ")
        parts = left.split()
        if not sep or len(parts) < 5 or not right.split():
            continue
        point = parts[4].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > len(best[0])):
            best = (point, right.split()[0])
    return best


def durable_directory(directory: str | os.PathLike[str], *, allow_tmp: bool,
                      setting: str = "ckpt_dir", allow_setting: str = "allow_tmp",
                      mountinfo: Path = MOUNTINFO) -> Path:
    """The resolved directory, created if missing. ``CheckpointLocationError`` when it is a
    scratch location and ``allow_tmp`` is False; ``setting`` and ``allow_setting`` are the
    names the error gives (the CLI passes its flags)."""
    raw = os.fspath(directory)
    if not raw:
        raise CheckpointLocationError(f"{setting}: empty; give a durable directory")
    path = Path(raw).expanduser().resolve()
    if not allow_tmp:
        scratch = {str(Path(d).resolve()) for d in (*SCRATCH_DIRS, tempfile.gettempdir())}
        for root in sorted(scratch):
            if str(path) == root or str(path).startswith(root.rstrip("/") + "/"):
                raise CheckpointLocationError(
                    f"{setting} {raw!r} is under {root}, which does not survive the node; "
                    f"give a durable directory, or set {allow_setting} to use it anyway")
        mount = _mount_of(path, mountinfo)
        if mount is not None and mount[1] in VOLATILE_FS:
            raise CheckpointLocationError(
                f"{setting} {raw!r} is on a {mount[1]} mount ({mount[0]}), which does not "
                f"survive the node; give a durable directory, or set {allow_setting}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointLocationError(f"{setting} {raw!r}: cannot create it ({exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise CheckpointLocationError(f"{setting} {raw!r}: not writable by this user")
    return path
