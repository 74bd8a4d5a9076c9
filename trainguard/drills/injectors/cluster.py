"""A node of the dev Slurm cluster lost as nodes go: its link downed, then every process of its
network namespace killed (slurmd, the node's agent, the job's ranks), in that order, so that
nothing of it gets a last word out. ``undo`` leaves it lost (the drill's teardown brings the
node back); it is held by nobody."""

from __future__ import annotations

import os
import signal
import subprocess

from trainguard.drills.injectors.base import Acted, InjectionError
from trainguard.events.clock import now_us


class ClusterNodeLoss:
    def __init__(self, node: str, netns: str, veth: str) -> None:
        self.node, self.netns, self.veth = node, netns, veth

    def inject(self) -> Acted:
        t = now_us()
        down = subprocess.run(["ip", "link", "set", self.veth, "down"], capture_output=True,
                              text=True, check=False)
        if down.returncode != 0:
            raise InjectionError(f"node {self.node}: ip link set {self.veth} down: "
                                 f"{down.stderr.strip()}")
        listed = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True,
                                text=True, check=False)
        if listed.returncode != 0:
            raise InjectionError(f"node {self.node}: ip netns pids {self.netns}: "
                                 f"{listed.stderr.strip()}")
        killed: list[str | int | float | bool | None] = []
        for pid in (int(p) for p in listed.stdout.split()):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
        if not killed:
            raise InjectionError(f"node {self.node}: nothing ran in {self.netns}")
        return Acted(t, {"node": self.node, "link": f"{self.veth} down", "pids": killed,
                         "signal": "SIGKILL", "spread_us": now_us() - t})

    def undo(self) -> Acted:
        return Acted.now(node=self.node, undo="none: a lost node stays lost until the drill's "
                         "teardown brings it back")
