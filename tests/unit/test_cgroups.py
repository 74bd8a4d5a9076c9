from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.actuators.cgroups import CgroupError, cpu_controller, create


def test_v2_tree_gets_cpu_max_and_delegation(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    root, version = cpu_controller(v1_root=tmp_path / "absent", v2_roots=(tmp_path,))
    assert (root, version) == (tmp_path, 2)
    group = create("rank-3", root=root, version=version)
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+cpu"
    group.set_quota_pct(150)
    assert (group.path / "cpu.max").read_text() == "150000 100000"
    assert group.quota_pct() == 150
    group.set_quota_pct(None)
    assert (group.path / "cpu.max").read_text() == "max 100000"
    assert group.quota_pct() is None


def test_v1_files(tmp_path: Path) -> None:
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    root, version = cpu_controller(v1_root=tmp_path, v2_roots=())
    group = create("u1", root=root, version=version)
    group.set_quota_pct(50)
    assert (group.path / "cpu.cfs_quota_us").read_text() == "50000"
    assert (group.path / "cpu.cfs_period_us").read_text() == "100000"


def test_no_controller_is_said_by_name(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match=r"no writable CPU cgroup controller.*cpu\.cfs_quota_us"):
        cpu_controller(v1_root=tmp_path / "none", v2_roots=(tmp_path / "none2",))


def test_bad_names_and_quotas_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="name"):
        create("../x", root=tmp_path, version=1)
    (tmp_path / "cpu.cfs_quota_us").write_text("-1")
    group = create("ok", root=tmp_path, version=1)
    with pytest.raises(ValueError, match="pct"):
        group.set_quota_pct(0)
