"""The job a drill runs: the reference PyTorch DDP workload under the local backend, its units
(CPU sets labelled with a drill node), spares, and checkpoint policy. One definition, so the
baseline run and every scenario run the same job."""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from trainguard.compat import StrEnum

THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # tiny model: one thread each
NODE_LABEL = "drill_node"  # which (logical) node a unit is on; node loss kills one node's


class Launcher(StrEnum):
    """How the job's ranks start on the Slurm cluster: each rank a step the slurm backend
    launched (every rank relaunched by a migrate), or each node a torchrun agent step with
    c10d rendezvous at the head's store (an elastic job: a migrate replaces the moved nodes'
    agents alone, the others restart their workers into the new round)."""

    SRUN = "srun"
    TORCHRUN = "torchrun"


@dataclass(frozen=True)
class DrillJob:
    world: int = 4  # the straggler rule judges a rank against >= 3 peers
    ckpt_every: int = 10
    keep: int = 3
    seed: int = 7
    step_ms: float = 50.0
    batch: int = 32
    timeout_s: float = 20.0  # collective timeout: a hung peer ends the others after this
    spares: int = 3  # a node loss takes ranks 1-3
    steps: int = 100_000  # never reached: the drill stops the job

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def units(self) -> list[dict[str, Any]]:
        """Rank 0 on node-a, the other ranks on node-b; the spares on node-a. Ranks alternate
        between the two cores, and so do the spares (from the other core), so a node loss
        (ranks 1-3 onto the three spares) keeps two ranks per core. (With 3 ranks, two shared
        a core: true stragglers against the third for a two-peer median.)"""
        out: list[dict[str, Any]] = []
        for r in range(self.world):
            node = "node-a" if r == 0 else "node-b"
            out.append({"name": f"u{r}", "cpus": [r % 2], "rank": r,
                        "labels": {NODE_LABEL: node, "rack": "r1"}})
        for i in range(self.spares):
            out.append({"name": f"spare{i}", "cpus": [(i + 1) % 2],
                        "labels": {NODE_LABEL: "node-a", "rack": "r1"}})
        return out

    def workload_argv(self, *, progress_dir: Path, python: str = "python",
                      master_addr: str = "127.0.0.1") -> list[str]:
        return [python, "-m", "trainguard.workload.ddp", "--job-id", "{job_id}",
                "--rank", "{rank}", "--world-size", "{world_size}",
                "--master-addr", master_addr, "--master-port", "{port}",
                *self.training_args(progress_dir)]

    def training_args(self, progress_dir: Path) -> list[str]:
        """The workload's arguments past its identity and rendezvous: what it computes, where
        it saves and logs."""
        return ["--ckpt-dir", "{ckpt_dir}", "--steps", str(self.steps),
                "--ckpt-every", str(self.ckpt_every), "--keep", str(self.keep),
                "--seed", str(self.seed), "--step-ms", str(self.step_ms),
                "--batch", str(self.batch), "--timeout-s", str(self.timeout_s), "--cpu",
                "--progress-file", str(progress_dir / "rank{rank}-e{epoch}.jsonl")]

    def spec(self, job_id: str, ckpt_dir: Path, run_dir: Path, node: str,
             agent_socket: Path, netns: tuple[Path, str] | None = None) -> dict[str, Any]:
        """The local backend's job spec (``trainguard.actuators.jobspec``). ``netns``: (the
        unit -> namespace map, rank 0's node address): every rank runs in its node's network
        namespace (``netwrap``), the job's traffic crossing the drill's veth link."""
        command = self.workload_argv(progress_dir=run_dir / "progress", python=sys.executable,
                                     master_addr=netns[1] if netns else "127.0.0.1")
        if netns is not None:
            command = [sys.executable, "-m", "trainguard.drills.netwrap", "--map",
                       str(netns[0]), "--unit", "{unit}", "--", *command]
        return {"job_id": job_id, "world_size": self.world, "node": node,
                "ckpt_dir": str(ckpt_dir), "grace_s": 3,
                "command": command,
                "env": {"TRAINGUARD_AGENT_SOCKET": str(agent_socket), **THREADS},
                "log_dir": str(run_dir / "ranks"), "units": self.units()}

    def actuator_args(self) -> list[str]:
        """Extra ``trainguard actuator`` arguments (the backend): none for the local one."""
        return []

    def actuator_env(self) -> dict[str, str]:
        return {}

    def write_spec(self, path: Path, **kw: Any) -> str:
        text = yaml.safe_dump(self.spec(**kw), sort_keys=True)
        path.write_text(text)
        return text

    def node_units(self, node: str) -> list[str]:
        return [u["name"] for u in self.units() if u["labels"][NODE_LABEL] == node]
