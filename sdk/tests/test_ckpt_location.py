"""The durable-location rule: scratch directories are refused by name of the setting, unless
explicitly allowed."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from trainguard_sdk.checkpoint.location import CheckpointLocationError, durable_directory


@pytest.mark.parametrize("where", ["/tmp/tg-ckpt-x", "/var/tmp/tg-ckpt-x", "/dev/shm/tg-x",
                                   "/tmp"])
def test_scratch_paths_are_refused_naming_the_setting(where: str) -> None:
    with pytest.raises(CheckpointLocationError) as info:
        durable_directory(where, allow_tmp=False, setting="--ckpt-dir",
                          allow_setting="--allow-tmp-ckpt")
    msg = str(info.value)
    assert "--ckpt-dir" in msg and "--allow-tmp-ckpt" in msg and where in msg
    assert not Path(where).exists() or where == "/tmp"  # refused before creating anything


def test_allowed_when_asked(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    assert durable_directory(target, allow_tmp=True) == target.resolve()
    assert target.is_dir()


def test_a_symlink_into_tmp_is_seen_through(tmp_path: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="tg-durable-", dir=Path.home()))
    try:
        link = home / "ckpt"
        link.symlink_to(tmp_path)
        with pytest.raises(CheckpointLocationError, match="directory"):
            durable_directory(link, allow_tmp=False)
    finally:
        link.unlink()
        home.rmdir()


def test_tmpfs_mounts_are_refused(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "22 1 0:21 / / rw,relatime - ext4 /dev/vda rw\n"
        "30 22 0:40 / /scratch rw,nosuid - tmpfs tmpfs rw,size=100k\n")
    with pytest.raises(CheckpointLocationError, match=r"tmpfs mount .*/scratch.*allow_tmp"):
        durable_directory("/scratch/job/ckpt", allow_tmp=False, mountinfo=mountinfo)


def test_a_durable_directory_is_accepted(tmp_path: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="tg-durable-", dir=Path.home()))
    try:
        mountinfo = tmp_path / "mountinfo"
        mountinfo.write_text("22 1 0:21 / / rw,relatime - ext4 /dev/vda rw\n")
        got = durable_directory(home / "ckpt", allow_tmp=False, mountinfo=mountinfo)
        assert got.is_dir()
        got.rmdir()
    finally:
        home.rmdir()


def test_empty_setting_is_refused() -> None:
    with pytest.raises(CheckpointLocationError, match="directory: empty"):
        durable_directory("", allow_tmp=True, setting="directory")
