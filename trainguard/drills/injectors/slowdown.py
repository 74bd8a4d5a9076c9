"""A slowdown through the CPU controller: the process's own cgroup (where the local backend
put the unit) gets a quota of ``cpu_pct`` % of a core; when the process is in no trainguard
cgroup, a drill cgroup is made for it. Undo restores the previous quota (and removes a drill
cgroup). Tier-1 remediation raising the unit's quota removes the fault, as it should."""

from __future__ import annotations

import os
from pathlib import Path

from trainguard.actuators import cgroups
from trainguard.drills.injectors.base import Acted, InjectionError


def cgroup_of(pid: int, proc: Path = Path("/proc")) -> cgroups.CpuCgroup | None:
    """The process's CPU cgroup under ``trainguard/`` (v1 ``cpu`` or v2), if it has one."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        parts = controllers.split(",")
        if "cpu" in parts and "/trainguard/" in path + "/":
            return cgroups.CpuCgroup(cgroups.V1_ROOT / path.lstrip("/"), 1)
        if controllers == "" and "/trainguard/" in path + "/":
            for root in cgroups.V2_ROOTS:
                if (root / path.lstrip("/") / "cpu.max").exists():
                    return cgroups.CpuCgroup(root / path.lstrip("/"), 2)
    return None


class CgroupThrottle:
    def __init__(self, pid: int, cpu_pct: float, tag: str = "") -> None:
        self.pid, self.cpu_pct = pid, cpu_pct
        self.tag = tag or str(os.getpid())
        self.group: cgroups.CpuCgroup | None = None
        self.own = False
        self.previous: float | None = None

    def inject(self) -> Acted:
        try:
            group = cgroup_of(self.pid)
            if group is None:
                group = cgroups.create(f"drill-{self.tag}-{self.pid}")
                group.add(self.pid)
                self.own = True
            self.previous = group.quota_pct()
            group.set_quota_pct(self.cpu_pct)
        except (cgroups.CgroupError, OSError) as exc:
            raise InjectionError(f"cgroup throttle of pid {self.pid}: {exc}") from None
        self.group = group
        return Acted.now(pid=self.pid, method="cgroup cpu quota", cpu_quota_pct=self.cpu_pct,
                         cgroup=str(group.path), cgroup_version=group.version,
                         previous_pct=self.previous)

    def undo(self) -> Acted:
        if self.group is None:
            return Acted.now(pid=self.pid, undo="nothing to undo")
        group, self.group = self.group, None
        try:
            now = group.quota_pct()
            if now == self.cpu_pct:  # nobody (tier 1) changed it meanwhile: put it back
                group.set_quota_pct(self.previous)
            if self.own:
                group.remove()
        except FileNotFoundError:
            return Acted.now(pid=self.pid, undo="the cgroup is gone (its unit was released)")
        except (cgroups.CgroupError, OSError) as exc:
            raise InjectionError(f"undoing the throttle of pid {self.pid}: {exc}") from None
        return Acted.now(pid=self.pid, cgroup=str(group.path), quota_found_pct=now,
                         restored_pct=self.previous if now == self.cpu_pct else now)
