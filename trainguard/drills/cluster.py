"""The drills' Slurm stack: the dev cluster (3 nodes + 1 spare, one agent per node publishing
to the cluster's own broker, which the drill's services use too), one ``--no-kill`` allocation
per scenario, and the job the slurm backend launches there.

The job is the reference workload (``trainguard.workload.ddp``), one rank per node, each rank a
Slurm step the actuator (``--backend slurm``) starts with ``srun``; the step runs in its node's
namespace, reports through its own node's agent (``TRAINGUARD_AGENT_SOCKET`` set per node), and
meets its peers over the namespace network (gloo on ``eth0``; as master the address of the
node rank 0 is placed on at each launch: ``{master_addr}``).
The checkpoint directory is a plain directory of the cluster's shared one, which every node
sees, as every node sees the job's reliable storage in production (not the local drills' loop
file system: ``slurmd`` runs under ``ip netns exec``, in a mount namespace of its own, and a
file system mounted after it started is invisible to its steps).
"""

from __future__ import annotations

import contextlib
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainguard.actuators.jobspec import MASTER_ADDR
from trainguard.actuators.journal import Journal
from trainguard.actuators.slurm_cli import SlurmCli, SlurmCliError
from trainguard.actuators.slurm_steps import released, step_record_of
from trainguard.dev.kafka import KafkaBroker
from trainguard.dev.slurm import (
    AgentPlan,
    ClusterInfo,
    ClusterSpec,
    SlurmCluster,
    host_end,
    torchrun_argv,
)
from trainguard.drills.job import NODE_LABEL, THREADS, DrillJob, Launcher

SPEC = ClusterSpec(nodes=3, spares=1)
AGENT_INTERVAL_S = 1.0  # node_silent: max(10 agent intervals, 10 s) of silence


def host_veth(info: ClusterInfo, node: str) -> str:
    """The bridge end of a node's link."""
    return host_end([n.name for n in info.nodes], node)


@dataclass(frozen=True)
class ClusterJob(DrillJob):
    """The drill job on the cluster: one rank per node (``tgn1..tgn3``), the spare ``tgn4``."""

    world: int = 3
    spares: int = 1
    nodes: tuple[str, ...] = ("tgn1", "tgn2", "tgn3")
    spare_nodes: tuple[str, ...] = ("tgn4",)
    # node -> its address on the bridge: a unit's ``address``; the ranks meet at rank 0's
    # (``{master_addr}``), wherever a migration has put it
    addresses: Mapping[str, str] = field(default_factory=dict)
    agents_root: str = ""  # <cluster>/agents: each node's step socket is <root>/<node>/agent.sock
    alloc: int = 0  # the scenario's Slurm allocation
    conf: str = ""  # SLURM_CONF
    cluster_root: str = ""  # the dev cluster's state directory (its power-off command's)
    extra: Mapping[str, Any] = field(default_factory=dict)
    launcher: Launcher = Launcher.SRUN
    rdzv_endpoint: str = ""  # the head's rendezvous store (torchrun's c10d)

    def to_dict(self) -> dict[str, Any]:
        """What the job computes (the baseline's key): not where it ran."""
        d = asdict(self)
        for k in ("agents_root", "alloc", "conf", "cluster_root", "extra", "addresses",
                  "rdzv_endpoint"):
            d.pop(k)
        d["stack"] = "slurm"
        return d

    def units(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [
            {"name": n, "cpus": [], "rank": r, "labels": {NODE_LABEL: n, "rack": "r1"}}
            for r, n in enumerate(self.nodes[:self.world])]
        out += [{"name": n, "cpus": [], "labels": {NODE_LABEL: n, "rack": "r1"}}
                for n in self.spare_nodes[:self.spares]]
        for u in out:
            if u["name"] in self.addresses:
                u["address"] = self.addresses[u["name"]]
        return out

    def spec(self, job_id: str, ckpt_dir: Path, run_dir: Path, node: str,
             agent_socket: Path, netns: tuple[Path, str] | None = None) -> dict[str, Any]:
        """The slurm backend's job spec: units are the allocation's nodes; each rank's step
        reports to its own node's agent. Under torchrun each step is the node's torchrun agent
        (one worker: ``{rank}`` is the node's slot), an elastic job: restarts of its workers
        are the agent's (``--max-restarts 3``), and a migrate replaces the moved nodes'
        agents alone."""
        progress = run_dir / "progress"
        elastic = self.launcher is Launcher.TORCHRUN
        if elastic:
            command = torchrun_argv(self.rdzv_endpoint, nnodes=self.world, nproc_per_node=1,
                                    run_id="{job_id}", max_restarts=3,
                                    script=["-m", "trainguard.workload.ddp",
                                            *self.training_args(progress)])
        else:
            command = self.workload_argv(progress_dir=progress, python=sys.executable,
                                         master_addr=MASTER_ADDR)
        return {"job_id": job_id, "world_size": self.world, "node": "slurm-head",
                "elastic": elastic, "ckpt_dir": str(ckpt_dir), "grace_s": 3,
                "command": command,
                "env": {**THREADS, "GLOO_SOCKET_IFNAME": "eth0",
                        "TRAINGUARD_AGENT_SOCKET": f"{self.agents_root}/{{unit}}/agent.sock"},
                "log_dir": str(run_dir / "ranks"), "units": self.units()}

    def actuator_args(self) -> list[str]:
        """The slurm backend on the allocation; its fence agent the dev cluster's power-off
        (a BMC's stand-in: a node cut off is powered off before its steps count as gone)."""
        fence = shlex.join([sys.executable, "-m", "trainguard.cli.main", "dev", "slurm",
                            "power-off", "{node}", "--state-dir", self.cluster_root])
        return ["--backend", "slurm", "--slurm-job", str(self.alloc), "--fence-command", fence]

    def actuator_env(self) -> dict[str, str]:
        return {"SLURM_CONF": self.conf}


@dataclass
class StepFacts:
    """What Slurm says, as the window closes, about the steps the actuator ran on a node."""

    node: str
    # journalled: rank, epoch, step id, listed by scontrol?, gone (not listed, or its node DOWN
    # and out of the allocation: ``slurm_steps.released``)
    steps: list[dict[str, Any]]
    node_state: str
    node_reason: str
    spare_steps: list[dict[str, Any]]  # steps alive on the spares

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ClusterSite:
    """The cluster for one drill run (the dev cluster's default state directory: a running dev
    cluster is replaced, and everything is stopped after the run)."""

    def __init__(self, prefix: str, say: Any = print, root: Path | None = None) -> None:
        self.cluster = SlurmCluster(root)
        self.prefix = prefix
        self.say = say
        self.info: ClusterInfo | None = None

    def __enter__(self) -> ClusterSite:
        # whatever a crashed or earlier run left (daemons, namespaces, stray node links, the
        # agents' spools) is swept by the fresh start
        self.cluster.stop()
        try:
            self.info = self.cluster.start(SPEC, timeout_s=90, agents=AgentPlan(
                prefix=self.prefix, interval_s=AGENT_INTERVAL_S))
        except BaseException:
            self.cluster.stop()
            raise
        self.say(f"[cluster] Slurm cluster up: {', '.join(n.name for n in self.info.nodes)} "
                 f"(agents to {self.info.agents_bootstrap}, prefix {self.prefix})")
        return self

    def __exit__(self, *exc: object) -> None:
        for node in self.nodes():
            subprocess.run(["ip", "link", "set", host_veth(self.require(), node), "up"],
                           capture_output=True, check=False)
        self.cluster.stop()
        self.say("[cluster] Slurm cluster stopped (daemons, agents, namespaces, broker)")

    def require(self) -> ClusterInfo:
        if self.info is None:
            raise RuntimeError("the cluster is not started")
        return self.info

    def nodes(self) -> list[str]:
        return [n.name for n in self.require().nodes]

    @property
    def broker(self) -> KafkaBroker:
        return self.cluster.broker

    def cli(self) -> SlurmCli:
        return SlurmCli(self.cluster.client_env())

    def job(self, base: ClusterJob | None = None, alloc: int = 0,
            launcher: Launcher = Launcher.SRUN) -> ClusterJob:
        info = self.require()
        b = base or ClusterJob()
        names = [n.name for n in info.nodes]
        return ClusterJob(**{**{k: getattr(b, k) for k in DrillJob.__dataclass_fields__},
                             "nodes": tuple(names[:SPEC.nodes]),
                             "spare_nodes": tuple(names[SPEC.nodes:]),
                             "addresses": {n.name: n.address for n in info.nodes},
                             "agents_root": str(self.cluster.root / "agents"),
                             "alloc": alloc, "conf": info.conf, "launcher": launcher,
                             "rdzv_endpoint": info.rdzv_endpoint,
                             "cluster_root": str(self.cluster.root)})

    def node_veth(self) -> dict[str, tuple[str, str]]:
        """node -> (its namespace, the bridge end of its link)."""
        info = self.require()
        return {n.name: (n.netns, host_veth(info, n.name)) for n in info.nodes}

    def restore(self) -> None:
        """Every node back in service (after a scenario lost one)."""
        env = self.cluster.client_env()
        states = self.cluster.node_states()
        for node in self.nodes():
            subprocess.run(["ip", "link", "set", host_veth(self.require(), node), "up"],
                           capture_output=True, check=False)
            if states.get(node, "").startswith(("down", "idle*", "drain")) or \
                    self.cluster.agent_pid(node) is None:
                with contextlib.suppress(Exception):
                    self.cluster.start_node(node)
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], env=env,
                           capture_output=True, check=False)
        self.cluster.wait_nodes(self.nodes(), {"idle"}, timeout_s=90)

    @contextlib.contextmanager
    def allocation(self, timeout_s: float = 60.0) -> Iterator[int]:
        """A ``--no-kill`` allocation of every node (the job's and the spare), its batch script
        on the first node (rank 0's, never the one a scenario loses)."""
        env = self.cluster.client_env()
        names = self.nodes()
        done = subprocess.run(["sbatch", "--parsable", "--no-kill", f"-N{len(names)}", "-w",
                               ",".join(names), "-o", "/dev/null", "--wrap", "sleep infinity"],
                              env=env, capture_output=True, text=True, check=True, timeout=30)
        alloc = int(done.stdout.strip().split(";")[0])
        try:
            cli = self.cli()
            deadline = time.monotonic() + timeout_s
            while (j := cli.job(alloc)) is None or j.state != "RUNNING":
                if time.monotonic() > deadline:
                    raise RuntimeError(f"allocation {alloc} not running in {timeout_s:.0f} s: "
                                       f"{j}")
                time.sleep(0.3)
            self.say(f"[cluster] allocation {alloc} on {','.join(names)}")
            yield alloc
        finally:
            self.cancel(alloc)

    def cancel(self, alloc: int) -> None:
        """``scancel`` the allocation (again is harmless): its steps get SIGTERM, then SIGKILL."""
        subprocess.run(["scancel", str(alloc)], env=self.cluster.client_env(),
                       capture_output=True, check=False, timeout=30)

    def step_facts(self, journal: Path, job_id: str, alloc: int, node: str) -> StepFacts:
        """The old steps on the lost node: each journalled step's id and whether Slurm still
        lists it (``scontrol show step``), the node's state and reason, the spare's steps."""
        cli = self.cli()
        recs = [r for r in (step_record_of(x) for x in Journal(journal).read())
                if r is not None and r.alloc == alloc and r.job == job_id and r.step_id]
        try:
            listed = {s.step_id: s for s in cli.steps()}
            nodes = {n.name: n for n in cli.nodes()}
            job = cli.job(alloc)
        except SlurmCliError as exc:
            return StepFacts(node, [], f"unknown ({exc})", "", [])
        in_alloc = job.nodes if job is not None else ()
        spares = set(self.nodes()[SPEC.nodes:])
        lost = nodes.get(node)
        return StepFacts(
            node=node,
            steps=[{"rank": r.rank, "epoch": r.epoch, "step_id": r.step_id, "name": r.name,
                    "listed": r.step_id in listed,
                    "listed_state": getattr(listed.get(r.step_id), "state", None),
                    "gone": released(listed.get(r.step_id), in_alloc, nodes.values())}
                   for r in recs if r.unit == node],
            node_state=(f"{lost.state} {' '.join(sorted(lost.flags))}".strip()
                        if lost else "not listed"),
            node_reason=lost.reason if lost else "",
            spare_steps=[{"rank": r.rank, "epoch": r.epoch, "step_id": r.step_id,
                          "unit": r.unit, "listed": r.step_id in listed}
                         for r in recs if r.unit in spares])
