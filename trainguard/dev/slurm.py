"""A real Slurm cluster on this machine: munge, slurmctld on the head and one slurmd per "node",
each node a network namespace with its own address on a bridge.

What runs is Debian's ``slurm-wlm`` (22.05) and ``munge``, unmodified, as plain processes:

- a bridge ``tgsbr0`` in the host namespace holds the head's address (``10.252.0.1/24``);
- node ``i`` is the namespace ``tgs-<name>`` with one end of a veth pair on the bridge and its own
  address ``10.252.0.(10+i)``; its slurmd is started inside it with ``-N <name>`` (every node
  shares this machine's hostname, so the node name is given, never guessed);
- one munged, run as the ``munge`` user on its own socket, serves every daemon and client (a unix
  socket is a file: the namespaces share it);
- slurmctld runs on the head, on the bridge address, so the nodes reach it as they would a real
  controller, and ``scontrol``/``srun``/``sbatch`` on the head use the generated ``slurm.conf``
  (``SLURM_CONF``);
- a shared directory ``<state>/shared`` stands for the job's reliable storage (checkpoints). In
  production this is a parallel or network filesystem every node mounts (Lustre, GPFS, NFS) or an
  object store; here every namespace sees the same directory because namespaces share the mount
  table.

The last ``spares`` nodes carry the feature ``spare``: jobs are placed on the others
(``--constraint=!spare`` is not needed: the job names its nodes) and a spare is what a lost node is
swapped for.

Settings forced by this kernel and machine (found by running it): the cgroup layout is hybrid, so
``cgroup.conf`` says ``CgroupPlugin=cgroup/v1``, processes are tracked by
``proctrack/linuxproc`` and ``TaskPlugin=task/none``; ``SlurmctldHost`` is this machine's hostname
with the bridge address in parentheses; ``SlurmdParameters=config_overrides`` keeps a node whose
real core count differs from its configured one in service. No accounting daemon runs
(``AccountingStorageType=accounting_storage/none``), so ``sacct`` has no records here: a step is
confirmed gone through ``squeue``/``scontrol``.

Agents (``start(..., agents=AgentPlan(...))``): one ``trainguard agent`` per node, started inside
the node's namespace as ``--node <name>`` (the Slurm node name, which the pool also uses, so a
node-level verdict finds the ranks bound there), publishing to a broker on the head's bridge
address. With no broker given, the cluster runs its own (``<state>/kafka``): a single dev broker
with a second listener, ``NODES``, on the bridge address (the namespaces cannot reach the
head's loopback), the registry's topics created under the plan's prefix. Each agent has its
own pid file, log, spool and step socket under ``<state>/agents/<name>/``: namespaces share the
file system, so the step socket of a node's ranks is named per node
(``TRAINGUARD_AGENT_SOCKET=<state>/agents/$SLURMD_NODENAME/agent.sock`` in the job's
environment). The agents do not follow the kernel log (one kernel for every "node": each
agent would report every line as its own) and take no GPU source.

``start`` is idempotent (a running, answering cluster is left as it is; agents whose process
is gone are started again) and first sweeps whatever an earlier crashed run left (agents and
daemons by pid file and by namespace, namespaces, the broker, the bridge).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from trainguard.dev.kafka import KafkaBroker, free_port
from trainguard.dev.paths import state_dir
from trainguard.dev.procs import alive, read_pid, stop_pid
from trainguard.netlab.ns import Netns

BRIDGE = "tgsbr0"
NETNS_PREFIX = "tgs-"
SUBNET = "10.252.0"  # /24; the drills' veth labs use 10.200-250.x, so never this one
HEAD_ADDR = f"{SUBNET}.1"
CLUSTER_NAME = "tgdev"
SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
RDZV_PORT = 29400
MUNGE_DIR = Path("/run/trainguard-munge")  # munged runs as `munge`: it must reach this path
TOOLS = ("slurmctld", "slurmd", "scontrol", "sinfo", "srun", "squeue", "scancel", "munged",
         "ip")
MAX_NODES = 200


class SlurmError(RuntimeError):
    """The cluster could not be set up or asked; the message says which step and why."""


@dataclass(frozen=True)
class ClusterSpec:
    """What to run: ``nodes`` job nodes and ``spares`` spare nodes, named ``tgn1..``."""

    nodes: int
    spares: int = 0
    cpus_per_node: int = 2

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.spares < 0 or self.nodes + self.spares > MAX_NODES:
            raise SlurmError(f"nodes: need 1 <= nodes and 0 <= spares and nodes + spares <= "
                             f"{MAX_NODES} (got nodes={self.nodes} spares={self.spares})")
        if self.cpus_per_node < 1:
            raise SlurmError(f"cpus_per_node: must be >= 1 (got {self.cpus_per_node})")

    @property
    def names(self) -> list[str]:
        return [f"tgn{i}" for i in range(1, self.nodes + self.spares + 1)]

    @property
    def spare_names(self) -> list[str]:
        return self.names[self.nodes:]

    def address(self, name: str) -> str:
        return f"{SUBNET}.{10 + self.names.index(name) + 1}"


@dataclass(frozen=True)
class AgentPlan:
    """One ``trainguard agent`` per node: to ``bootstrap`` (reachable from the namespaces; None:
    the cluster's own broker on the bridge), topics under ``prefix``, one record per
    ``interval_s``."""

    bootstrap: str | None = None
    prefix: str = "tg"
    interval_s: float = 1.0

    def __post_init__(self) -> None:
        if self.interval_s < 0.1:
            raise SlurmError(f"interval_s: must be >= 0.1 (got {self.interval_s})")


@dataclass(frozen=True)
class Node:
    name: str
    address: str
    netns: str
    spare: bool
    agent_socket: str | None = None  # the step socket of its agent (None: no agents)


@dataclass(frozen=True)
class ClusterInfo:
    """What a running cluster is, as ``status`` prints it (and as tests and drills read it)."""

    conf: str
    shared_dir: str
    head_address: str
    nodes: tuple[Node, ...]
    ctld_pid: int
    munge_socket: str
    started_at: float
    rdzv_endpoint: str = f"{HEAD_ADDR}:{RDZV_PORT}"
    agents_bootstrap: str | None = None  # where the nodes' agents publish (None: no agents)
    agents_prefix: str | None = None
    agents_interval_s: float = 1.0

    def env(self) -> dict[str, str]:
        """Variables a Slurm client on the head needs."""
        return {"SLURM_CONF": self.conf}

    @staticmethod
    def from_json(doc: dict[str, object]) -> ClusterInfo:
        raw_nodes = doc["nodes"]
        assert isinstance(raw_nodes, list)
        nodes = tuple(Node(**n) for n in raw_nodes)
        return ClusterInfo(conf=str(doc["conf"]), shared_dir=str(doc["shared_dir"]),
                           head_address=str(doc["head_address"]), nodes=nodes,
                           ctld_pid=int(str(doc["ctld_pid"])),
                           munge_socket=str(doc["munge_socket"]),
                           started_at=float(str(doc["started_at"])),
                           rdzv_endpoint=str(doc["rdzv_endpoint"]),
                           agents_bootstrap=_opt_str(doc.get("agents_bootstrap")),
                           agents_prefix=_opt_str(doc.get("agents_prefix")),
                           agents_interval_s=float(str(doc.get("agents_interval_s", 1.0))))


def node_links(ip_link_show: str) -> list[str]:
    """The head ends of node links (``tgsv<i>``) in ``ip -o link show``'s output."""
    out = []
    for line in ip_link_show.splitlines():
        parts = line.split(":")
        if len(parts) >= 3:
            name = parts[1].strip().split("@")[0]
            if re.fullmatch(r"tgsv\d+", name):
                out.append(name)
    return out


def _node_links() -> list[str]:
    """Node links that outlived their namespace: deleting a namespace can leave its veth's
    bridge end behind (seen after a node-loss drill downed the link), and the next start
    then fails on ``ip link add tgsv1``. Deleting one end deletes both."""
    return node_links(_run(["ip", "-o", "link", "show"], check=False).stdout)


def _opt_str(value: object) -> str | None:
    return None if value is None else str(value)


# ---- pure: the files -------------------------------------------------------------------------

def slurm_conf(spec: ClusterSpec, root: Path, hostname: str, munge_socket: Path) -> str:
    """The cluster's ``slurm.conf``: every path under ``root``, nodes on the bridge subnet."""
    lines = [
        f"ClusterName={CLUSTER_NAME}",
        f"SlurmctldHost={hostname}({HEAD_ADDR})",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={root / 'ctld'}",
        f"SlurmdSpoolDir={root / 'spool' / '%n'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}",
        f"SlurmdPidFile={root / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}",
        f"SlurmdLogFile={root / 'slurmd-%n.log'}",
        f"SlurmctldPort={SLURMCTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        # A node is declared DOWN 10 s after its slurmd stops answering (pings every ~3 s).
        "SlurmdTimeout=10",
        "SlurmctldTimeout=10",
        "MessageTimeout=5",
        # A node whose slurmd comes back (registering valid) returns to service by itself.
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "KillWait=5",
    ]
    for name in spec.names:
        feature = " Features=spare" if name in spec.spare_names else ""
        lines.append(f"NodeName={name} NodeAddr={spec.address(name)} "
                     f"CPUs={spec.cpus_per_node}{feature} State=UNKNOWN")
    # Several tasks share a node's cores here (2 real cores for the whole cluster).
    lines.append("PartitionName=tg Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
                 "OverSubscribe=FORCE:8")
    return "\n".join(lines) + "\n"


def cgroup_conf() -> str:
    # slurmd reads cgroup.conf from the directory of the slurm.conf it is given.
    return "CgroupPlugin=cgroup/v1\nConstrainCores=no\nConstrainRAMSpace=no\n"


def bridge_listeners(port: int, nodes_port: int, controller_port: int) -> dict[str, str]:
    """The dev broker's listeners when the nodes publish to it: the head's clients on loopback
    as always, the namespaces on the bridge address (``NODES``); each advertises itself, so a
    client is sent back to the address it reached."""
    return {
        "listeners": f"PLAINTEXT://127.0.0.1:{port},NODES://{HEAD_ADDR}:{nodes_port},"
                     f"CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},NODES://{HEAD_ADDR}:{nodes_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,NODES:PLAINTEXT,"
                                          "CONTROLLER:PLAINTEXT",
    }


def agent_argv(name: str, root: Path, bootstrap: str, prefix: str, interval_s: float, *,
               python: str = sys.executable) -> list[str]:
    """The command that runs node ``name``'s agent inside its namespace."""
    home = root / "agents" / name
    return ["ip", "netns", "exec", NETNS_PREFIX + name, python, "-m", "trainguard.cli.main",
            "agent", "--node", name, "--bootstrap", bootstrap, "--prefix", prefix,
            "--interval-s", f"{interval_s:g}", "--spool-dir", str(home / "spool"),
            "--socket", str(home / "agent.sock"), "--metrics-port", "0", "--gpu", "none",
            "--no-kernel-log"]


def parse_node_states(text: str) -> dict[str, str]:
    """``sinfo -h -N -o '%N %T'`` → node name → state (``idle``, ``alloc``, ``down*``...)."""
    states: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return states


# ---- I/O: the cluster ------------------------------------------------------------------------

def _run(argv: Sequence[str], *, timeout_s: float = 15.0, check: bool = True,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmError(f"{' '.join(argv)}: {exc}") from None
    if check and done.returncode != 0:
        raise SlurmError(f"{' '.join(argv)}: exit {done.returncode}: "
                         f"{(done.stderr or done.stdout).strip()[-400:]}")
    return done


class SlurmCluster:
    """The dev cluster whose state lives in ``root`` (default ``$TRAINGUARD_STATE/slurm``)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = (root or state_dir() / "slurm").resolve()

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def info_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def shared_dir(self) -> Path:
        return self.root / "shared"

    @property
    def munge_socket(self) -> Path:
        return MUNGE_DIR / "munge.socket"

    def client_env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- status -------------------------------------------------------------------------------

    def info(self) -> ClusterInfo | None:
        try:
            return ClusterInfo.from_json(json.loads(self.info_file.read_text()))
        except (OSError, ValueError, KeyError, TypeError, AssertionError):
            return None

    def node_states(self) -> dict[str, str]:
        done = _run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.client_env(), timeout_s=10)
        return parse_node_states(done.stdout)

    def running(self) -> ClusterInfo | None:
        """The cluster if its controller runs and answers, and its nodes exist."""
        info = self.info()
        if info is None or not alive(info.ctld_pid):
            return None
        if _run(["scontrol", "ping"], env=self.client_env(), check=False,
                timeout_s=10).returncode != 0:
            return None
        namespaces = set(_netns_list())
        if any(n.netns not in namespaces for n in info.nodes):
            return None
        return info

    # -- start --------------------------------------------------------------------------------

    def start(self, spec: ClusterSpec, *, timeout_s: float = 60.0,
              agents: AgentPlan | None = None) -> ClusterInfo:
        missing = [t for t in TOOLS if shutil.which(t) is None]
        if missing:
            raise SlurmError(f"missing tools: {', '.join(missing)} (install Debian's slurm-wlm "
                             "and munge)")
        running = self.running()
        if running is not None and [n.name for n in running.nodes] == spec.names and (
                agents is None or running.agents_bootstrap is not None):
            if running.agents_bootstrap is not None:
                self.start_agents(running)  # any agent that is gone
            return running
        self.stop()
        self._clear_spools()
        self._write_files(spec)
        self._network(spec)
        self._start_munge()
        ctld = self._start_ctld()
        for name in spec.names:
            self._start_slurmd(name)
        self._start_rdzv_store()
        bootstrap = None
        if agents is not None:
            bootstrap = agents.bootstrap or self._start_broker(agents.prefix)
        info = ClusterInfo(conf=str(self.conf), shared_dir=str(self.shared_dir),
                           head_address=HEAD_ADDR,
                           nodes=tuple(Node(n, spec.address(n), NETNS_PREFIX + n,
                                            n in spec.spare_names,
                                            None if agents is None else
                                            str(self.agent_socket(n)))
                                       for n in spec.names),
                           ctld_pid=ctld, munge_socket=str(self.munge_socket),
                           started_at=time.time(), agents_bootstrap=bootstrap,
                           agents_prefix=None if agents is None else agents.prefix,
                           agents_interval_s=1.0 if agents is None else agents.interval_s)
        self.info_file.write_text(json.dumps(asdict(info), indent=2))
        self.wait_nodes(spec.names, {"idle"}, timeout_s=timeout_s)
        if bootstrap is not None:
            self.start_agents(info)
        return info

    # -- the nodes' agents and their broker ---------------------------------------------------

    @property
    def broker(self) -> KafkaBroker:
        """The cluster's own broker (``<state>/kafka``), with its bridge listener."""
        root = self.root / "kafka"
        ports = root / "ports.json"
        try:
            port, nodes_port, cport = json.loads(ports.read_text())
        except (OSError, ValueError):
            port, nodes_port, cport = free_port(), free_port(), free_port()
            root.mkdir(parents=True, exist_ok=True)
            ports.write_text(json.dumps([port, nodes_port, cport]))
        return KafkaBroker(root, overrides=bridge_listeners(port, nodes_port, cport),
                           port=port, controller_port=cport)

    def _start_broker(self, prefix: str, timeout_s: float = 120.0) -> str:
        """Start the cluster's own broker, create the registry's topics under ``prefix``;
        return the bootstrap the nodes use (the bridge listener)."""
        import asyncio

        from trainguard.bus.admin import ensure_topics
        from trainguard.bus.config import KafkaConfig
        from trainguard.events.topics import TopicNames

        broker = self.broker
        try:
            info = broker.start(fresh=True, timeout_s=timeout_s)
            cfg = KafkaConfig(bootstrap=info.bootstrap, topic_prefix=prefix,
                              client_id="trainguard-dev-slurm")
            asyncio.run(asyncio.wait_for(ensure_topics(cfg, TopicNames(prefix)), 60))
        except Exception as exc:  # a broker, a client or a timeout error: one line says which
            raise SlurmError(f"the nodes' broker did not start: {type(exc).__name__}: {exc}"
                             ) from None
        nodes = broker.overrides["advertised.listeners"].split(",")[1]
        return nodes.removeprefix("NODES://")

    def agent_dir(self, name: str) -> Path:
        return self.root / "agents" / name

    def agent_socket(self, name: str) -> Path:
        return self.agent_dir(name) / "agent.sock"

    def agent_pid(self, name: str) -> int | None:
        pid = read_pid(self.agent_dir(name) / "agent.pid")
        return pid if pid and alive(pid) else None

    def start_agents(self, info: ClusterInfo, *, timeout_s: float = 30.0) -> dict[str, int]:
        """Start every node's agent that does not run; wait until each listens on its step
        socket. Returns node name -> agent pid."""
        for node in info.nodes:
            if self.agent_pid(node.name) is None:
                self.start_agent(node.name, info)
        deadline = time.monotonic() + timeout_s
        pids: dict[str, int] = {}
        for node in info.nodes:
            while True:
                pid = self.agent_pid(node.name)
                if pid is None:
                    raise SlurmError(f"the agent of {node.name} exited: "
                                     f"{_tail(self.agent_dir(node.name) / 'agent.log')}")
                if self.agent_socket(node.name).exists():
                    pids[node.name] = pid
                    break
                if time.monotonic() > deadline:
                    raise SlurmError(f"the agent of {node.name} did not open its step socket "
                                     f"in {timeout_s:.0f} s: "
                                     f"{_tail(self.agent_dir(node.name) / 'agent.log')}")
                time.sleep(0.1)
        return pids

    def start_agent(self, name: str, info: ClusterInfo) -> int:
        """Start node ``name``'s agent in its namespace (after a drill killed it, too)."""
        if info.agents_bootstrap is None or info.agents_prefix is None:
            raise SlurmError("this cluster was started without agents")
        home = self.agent_dir(name)
        home.mkdir(parents=True, exist_ok=True)
        self.agent_socket(name).unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_KAFKA_")}
        with (home / "agent.log").open("ab") as log:
            proc = subprocess.Popen(
                agent_argv(name, self.root, info.agents_bootstrap, info.agents_prefix,
                           info.agents_interval_s),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True)
        (home / "agent.pid").write_text(str(proc.pid))  # `ip netns exec` execs the agent
        return proc.pid

    def _clear_spools(self) -> None:
        """An earlier cluster's agents spooled records under its own topic prefix, which a
        fresh cluster's broker lacks: replayed first, they would hold back every new record."""
        for spool in (self.root / "agents").glob("*/spool"):
            shutil.rmtree(spool, ignore_errors=True)

    def stop_agents(self) -> bool:
        return _stop_pid_files(sorted((self.root / "agents").glob("*/agent.pid")))

    def _write_files(self, spec: ClusterSpec) -> None:
        for sub in ("etc", "ctld", "spool", "shared"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        # A fresh controller state: no job of an earlier cluster survives into this one.
        shutil.rmtree(self.root / "ctld", ignore_errors=True)
        (self.root / "ctld").mkdir()
        self.shared_dir.chmod(0o1777)
        self.conf.write_text(slurm_conf(spec, self.root, socket.gethostname(),
                                        self.munge_socket))
        (self.conf.parent / "cgroup.conf").write_text(cgroup_conf())

    def _network(self, spec: ClusterSpec) -> None:
        _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        _run(["ip", "addr", "add", f"{HEAD_ADDR}/24", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "up"])
        for name in spec.names:
            ns, veth = NETNS_PREFIX + name, host_end(spec.names, name)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0",
                  "netns", ns])
            _run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{spec.address(name)}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])

    def _start_munge(self) -> None:
        MUNGE_DIR.mkdir(mode=0o755, exist_ok=True)
        shutil.chown(MUNGE_DIR, "munge", "munge")
        MUNGE_DIR.chmod(0o755)
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            _run(["runuser", "-u", "munge", "--", "mungekey", "--create"])
        _run(["runuser", "-u", "munge", "--", "munged", f"--socket={self.munge_socket}",
              f"--pid-file={MUNGE_DIR / 'munged.pid'}", f"--log-file={MUNGE_DIR / 'munged.log'}",
              f"--seed-file={MUNGE_DIR / 'munged.seed'}", "--force"])
        deadline = time.monotonic() + 10
        while not self.munge_socket.exists():
            if time.monotonic() > deadline:
                raise SlurmError(f"munged did not create {self.munge_socket}: "
                                 f"{_tail(MUNGE_DIR / 'munged.log')}")
            time.sleep(0.05)

    def _start_ctld(self) -> int:
        _run(["slurmctld", "-f", str(self.conf)])
        deadline = time.monotonic() + 20
        while True:
            pid = read_pid(self.root / "slurmctld.pid")
            if pid and alive(pid) and _run(["scontrol", "ping"], env=self.client_env(),
                                            check=False).returncode == 0:
                return pid
            if time.monotonic() > deadline:
                raise SlurmError(f"slurmctld did not answer in 20 s: "
                                 f"{_tail(self.root / 'slurmctld.log')}")
            time.sleep(0.2)

    def _start_rdzv_store(self) -> None:
        log = (self.root / "rdzv_store.log").open("w")
        proc = subprocess.Popen([sys.executable, "-m", "trainguard.dev.rdzv_store", "--host",
                                 HEAD_ADDR, "--port", str(RDZV_PORT)], stdout=log, stderr=log,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        (self.root / "rdzv_store.pid").write_text(str(proc.pid))
        deadline = time.monotonic() + 30
        while not _listening(HEAD_ADDR, RDZV_PORT):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SlurmError(f"the rendezvous store did not start: "
                                 f"{_tail(self.root / 'rdzv_store.log')}")
            time.sleep(0.1)

    def _start_slurmd(self, name: str) -> None:
        _run(["ip", "netns", "exec", NETNS_PREFIX + name, "slurmd", "-f", str(self.conf),
              "-N", name])

    def start_node(self, name: str) -> None:
        """Bring a node's slurmd back (after a drill killed it), and its agent if the cluster
        has agents and the node's is gone."""
        self._start_slurmd(name)
        info = self.info()
        if info is not None and info.agents_bootstrap is not None \
                and self.agent_pid(name) is None:
            self.start_agent(name, info)

    def power_off(self, name: str) -> list[int]:
        """What a BMC's ``chassis power off`` does to a node, here: its link down, then every
        process of its namespace (slurmd, its agent, the job's steps) killed. The slurm
        backend's fence command for a node that cannot confirm a cancel (``--fence-command``):
        behind a partition its steps may still run, and only this proves them gone. Returns
        the pids killed; ``start_node`` (with the link up) brings it back."""
        info = self.info()
        if info is None or name not in [n.name for n in info.nodes]:
            raise SlurmError(f"node {name!r}: not a node of the cluster in {self.root}")
        return power_off(NETNS_PREFIX + name, host_end([n.name for n in info.nodes], name))

    def wait_nodes(self, names: Sequence[str], states: set[str], *,
                   timeout_s: float) -> dict[str, str]:
        """Until every node in ``names`` is in one of ``states`` (``down`` matches ``down*``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            now = self.node_states()
            if all(now.get(n, "").rstrip("*~#!%$@^-") in states for n in names):
                return now
            if time.monotonic() > deadline:
                raise SlurmError(f"nodes not {sorted(states)} in {timeout_s:.0f} s: {now}; "
                                 f"{_tail(self.root / 'slurmctld.log', 5)}")
            time.sleep(0.3)

    # -- stop ---------------------------------------------------------------------------------

    def stop(self) -> bool:
        """Stop every daemon, delete the namespaces and the bridge; True if anything ran.
        Works after a crash too: daemons are found by pid file and by namespace."""
        found = self.stop_agents()  # first: a SIGTERM lets each publish what it spooled
        for ns in _netns_list():
            if not ns.startswith(NETNS_PREFIX):
                continue
            found = True
            node = Netns(ns)  # kills whatever runs inside (slurmd, its steps), then deletes it
            node.created = True
            node.delete()
        found = _stop_pid_files((self.root / "slurmctld.pid", self.root / "rdzv_store.pid",
                                 MUNGE_DIR / "munged.pid")) or found
        if (self.root / "kafka").exists() and self.broker.stop():
            found = True
        if _run(["ip", "link", "show", BRIDGE], check=False).returncode == 0:
            found = True
            _run(["ip", "link", "del", BRIDGE], check=False)
        for link in _node_links():
            found = True
            _run(["ip", "link", "del", link], check=False)
        with contextlib.suppress(OSError):
            self.info_file.unlink()
        return found


def _stop_pid_files(pid_files: Iterable[Path]) -> bool:
    """Stop the process each pid file names (if alive) and remove the file; True if any
    was running."""
    found = False
    for pid_file in pid_files:
        pid = read_pid(pid_file)
        if pid and alive(pid):
            found = True
            stop_pid(pid)
        with contextlib.suppress(OSError):
            pid_file.unlink()
    return found


# The node's own address on eth0, with no braces: the command may be a job spec's, whose
# parts are filled with str.format ({rank}, {epoch} ...).
NODE_ADDR = "$(ip -4 -br addr show eth0 | tr -s ' ' | cut -d' ' -f3 | cut -d/ -f1)"


def torchrun_argv(rdzv_endpoint: str, *, nnodes: int, nproc_per_node: int, run_id: str,
                  script: Sequence[str], python: str = sys.executable,
                  max_restarts: int = 0, rdzv_conf: str = "") -> list[str]:
    """The command ``srun`` starts once per node: a torchrun agent in that node's namespace,
    c10d rendezvous at the head's store, its own address given (``--local-addr``: inside a
    namespace this machine's hostname resolves to localhost, which the other nodes cannot
    reach), gloo on the node's interface. ``max_restarts``: how many times the agent restarts
    its workers after one failed (a membership change, such as a spare joining, restarts them
    without counting). ``rdzv_conf``: torchrun's ``--rdzv-conf`` (``join_timeout=60``: how long
    a round waits for its nodes; 600 s by default).

    ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: with the rendezvous' TCP store shared (torch's
    default), an agent that was rank 0 before keeps its store info from the first round and
    never writes the new round's ``MASTER_ADDR``, so a spare joining a later round waits for it
    until its 60 s store timeout and fails (measured with torch 2.15 on the dev cluster)."""
    inner = ("GLOO_SOCKET_IFNAME=eth0 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
             f"exec {shlex.quote(python)} -m torch.distributed.run "
             f"--nnodes {nnodes} --nproc-per-node {nproc_per_node} --rdzv-backend c10d "
             f"--rdzv-endpoint {rdzv_endpoint} --rdzv-id {shlex.quote(run_id)} "
             f"--max-restarts {max_restarts} --local-addr {NODE_ADDR} "
             + (f"--rdzv-conf {shlex.quote(rdzv_conf)} " if rdzv_conf else "")
             + " ".join(shlex.quote(a) for a in script))
    return ["bash", "-c", inner]


def host_end(names: Sequence[str], node: str) -> str:
    """The bridge end of a node's link: ``tgsv<i>``, the nodes numbered in order from 1."""
    return f"tgsv{list(names).index(node) + 1}"


def power_off(netns: str, veth: str) -> list[int]:
    """A node's link down, then every process of its namespace killed (SIGKILL), in that
    order so that nothing of it gets a last word out; the pids killed."""
    _run(["ip", "link", "set", veth, "down"])
    listed = _run(["ip", "netns", "pids", netns])
    killed = []
    for pid in (int(p) for p in listed.stdout.split()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
    return killed


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _netns_list() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.strip()]


def _tail(path: Path, lines: int = 10) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no {path})"
