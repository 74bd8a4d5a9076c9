"""CPU quota for a unit of compute through cgroups: v1 ``cpu`` controller
(``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``) or v2 ``cpu.max``.

Used in two places: tier-1 remediation raises a unit's quota, and drills throttle a rank to
make it a straggler for real. Whatever cannot be done says so by name (no writable controller,
no permission), never silently.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

V1_ROOT = Path("/sys/fs/cgroup/cpu")
V2_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


class CgroupError(RuntimeError):
    pass


@dataclass(frozen=True)
class CpuCgroup:
    """One cgroup holding a unit's processes, with a CPU quota in percent of one core."""

    path: Path
    version: Literal[1, 2]

    @property
    def name(self) -> str:
        return self.path.name

    def set_quota_pct(self, pct: float | None, period_us: int = 100_000) -> None:
        """``pct`` of one core (200 = two cores); None removes the limit."""
        if pct is not None and pct <= 0:
            raise ValueError(f"pct: must be > 0 or None (got {pct})")
        quota = -1 if pct is None else max(1000, int(period_us * pct / 100))
        if self.version == 1:
            _write(self.path / "cpu.cfs_period_us", str(period_us))
            _write(self.path / "cpu.cfs_quota_us", str(quota))
        else:
            _write(self.path / "cpu.max", f"{'max' if quota < 0 else quota} {period_us}")

    def quota_pct(self) -> float | None:
        if self.version == 1:
            quota = int((self.path / "cpu.cfs_quota_us").read_text())
            period = int((self.path / "cpu.cfs_period_us").read_text())
        else:
            q, p = (self.path / "cpu.max").read_text().split()
            if q == "max":
                return None
            quota, period = int(q), int(p)
        return None if quota < 0 else 100 * quota / period

    def add(self, pid: int) -> None:
        """Move a process (all its threads) into this cgroup."""
        _write(self.path / "cgroup.procs", str(pid))

    def pids(self) -> list[int]:
        text = (self.path / "cgroup.procs").read_text()
        return [int(x) for x in text.split()]

    def throttled_us(self) -> int:
        """Total time the group's tasks were throttled (cpu.stat)."""
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        if "throttled_usec" in stat:
            return int(stat["throttled_usec"])
        return int(stat.get("throttled_time", "0")) // 1000  # v1 reports ns

    def remove(self) -> None:
        """Delete the group once empty; its processes go back to the parent first."""
        parent = self.path.parent / "cgroup.procs"
        for pid in self.pids():
            try:
                _write(parent, str(pid))
            except CgroupError:
                pass  # the process ended meanwhile
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise CgroupError(f"cannot remove {self.path}: {exc}") from None


def cpu_controller(v1_root: Path = V1_ROOT,
                   v2_roots: tuple[Path, ...] = V2_ROOTS) -> tuple[Path, Literal[1, 2]]:
    """Where a writable CPU controller is: v1 ``cpu`` first, else a v2 tree with ``cpu``."""
    if (v1_root / "cpu.cfs_quota_us").exists() and os.access(v1_root, os.W_OK):
        return v1_root, 1
    for root in v2_roots:
        controllers = root / "cgroup.controllers"
        if controllers.exists() and "cpu" in controllers.read_text().split() \
                and os.access(root, os.W_OK):
            return root, 2
    raise CgroupError(
        "no writable CPU cgroup controller: neither the v1 cpu controller "
        f"({v1_root}/cpu.cfs_quota_us) nor a v2 hierarchy with 'cpu' in cgroup.controllers "
        f"({', '.join(map(str, v2_roots))}) is writable by this process; run as root or "
        "delegate a cgroup subtree")


def create(name: str, parent: str = "trainguard", *, root: Path | None = None,
           version: Literal[1, 2] | None = None) -> CpuCgroup:
    if "/" in name or name in ("", ".", ".."):
        raise ValueError(f"name: a single path component (got {name!r})")
    if root is None or version is None:
        root, version = cpu_controller()
    base = root / parent
    base.mkdir(exist_ok=True)
    if version == 2:
        # v2: the parent must delegate the cpu controller to its children.
        _enable_subtree_cpu(root)
        _enable_subtree_cpu(base)
    path = base / name
    path.mkdir(exist_ok=True)
    return CpuCgroup(path, version)


def _enable_subtree_cpu(group: Path) -> None:
    control = group / "cgroup.subtree_control"
    if control.exists() and "cpu" not in control.read_text().split():
        _write(control, "+cpu")


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise CgroupError(f"cannot write {value!r} to {path}: {exc.strerror or exc}") from None
