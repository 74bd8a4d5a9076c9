"""Storage faults on a real file system: the checkpoint directory lives on a loop-mounted
ext4 image (``LoopFs``) that a drill can freeze (``fsfreeze``: every write blocks, in
uninterruptible sleep, until thawed) or take away (remounted read-only: writes fail with
EROFS). Needs root, ``mkfs.ext4``, ``mount``, ``fsfreeze``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from types import TracebackType

from trainguard.drills.injectors.base import Acted, InjectionError


def _run(*argv: str, timeout_s: float = 30.0) -> None:
    if shutil.which(argv[0]) is None:
        raise InjectionError(f"{argv[0]}: not installed")
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise InjectionError(f"{' '.join(argv)}: no answer in {timeout_s:.0f}s") from None
    if done.returncode != 0:
        raise InjectionError(f"{' '.join(argv)}: rc={done.returncode}: {done.stderr.strip()}")


def is_mounted(path: Path) -> bool:
    target = str(path.resolve())
    try:
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            if line.split()[4] == target:
                return True
    except OSError:
        return False
    return False


class LoopFs:
    """An ext4 image of ``size_mb`` at ``image``, loop-mounted on ``mountpoint``; unmounted
    (thawed and remounted read-write first if needed) and deleted on exit."""

    def __init__(self, image: Path, mountpoint: Path, size_mb: int = 256) -> None:
        self.image, self.mountpoint, self.size_mb = image, mountpoint, size_mb

    def __enter__(self) -> LoopFs:
        self.image.parent.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.image, "wb") as fh:
            fh.truncate(self.size_mb * 1024 * 1024)
        try:
            _run("mkfs.ext4", "-q", "-F", str(self.image))
            _run("mount", "-o", "loop", str(self.image), str(self.mountpoint))
        except InjectionError:
            self.image.unlink(missing_ok=True)
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if is_mounted(self.mountpoint):
            subprocess.run(["fsfreeze", "-u", str(self.mountpoint)], capture_output=True)
            subprocess.run(["mount", "-o", "remount,rw", str(self.mountpoint)],
                           capture_output=True)
            done = subprocess.run(["umount", str(self.mountpoint)], capture_output=True)
            if done.returncode != 0:  # busy: a straggling process; detach it anyway
                subprocess.run(["umount", "-l", str(self.mountpoint)], capture_output=True)
        self.image.unlink(missing_ok=True)


class FsFreeze:
    def __init__(self, mountpoint: Path) -> None:
        self.mountpoint = mountpoint
        self.frozen = False

    def inject(self) -> Acted:
        if not is_mounted(self.mountpoint):
            raise InjectionError(f"{self.mountpoint} is not a mount point: fsfreeze needs one")
        _run("fsfreeze", "-f", str(self.mountpoint))
        self.frozen = True
        return Acted.now(mount=str(self.mountpoint), method="fsfreeze -f")

    def undo(self) -> Acted:
        if not self.frozen:
            return Acted.now(mount=str(self.mountpoint), undo="nothing to undo")
        _run("fsfreeze", "-u", str(self.mountpoint))
        self.frozen = False
        return Acted.now(mount=str(self.mountpoint), method="fsfreeze -u")


class ReadOnly:
    """Remount read-only (``readonly``), or detach it (``unmount``: ``umount -l``; the path
    then shows the empty directory beneath, so writes land elsewhere — say so in reports)."""

    def __init__(self, mountpoint: Path, method: str = "readonly",
                 image: Path | None = None) -> None:
        if method not in ("readonly", "unmount"):
            raise InjectionError(f"method: readonly or unmount (got {method!r})")
        if method == "unmount" and image is None:
            raise InjectionError("unmount needs the image to mount it back")
        self.mountpoint, self.method, self.image = mountpoint, method, image
        self.active = False

    def inject(self) -> Acted:
        if not is_mounted(self.mountpoint):
            raise InjectionError(f"{self.mountpoint} is not a mount point")
        if self.method == "readonly":
            _run("mount", "-o", "remount,ro", str(self.mountpoint))
        else:
            _run("umount", "-l", str(self.mountpoint))
        self.active = True
        return Acted.now(mount=str(self.mountpoint), method=self.method)

    def undo(self) -> Acted:
        if not self.active:
            return Acted.now(mount=str(self.mountpoint), undo="nothing to undo")
        if self.method == "readonly":
            _run("mount", "-o", "remount,rw", str(self.mountpoint))
        else:
            assert self.image is not None
            _run("mount", "-o", "loop", str(self.image), str(self.mountpoint))
        self.active = False
        return Acted.now(mount=str(self.mountpoint), method=f"undo {self.method}")
