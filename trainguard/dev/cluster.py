"""A real multi-node Apache Kafka cluster (KRaft) on this machine, for development and tests.

Each node is a combined broker + controller (so 3 nodes make a 3-voter quorum that survives
one loss), in its own JVM, directory, ports and log under one state directory. Topics get the
cluster's replication factor (3) and ``min.insync.replicas`` (2) by default, the internal
topics (offsets, transactions) too, so an ``acks=all`` producer's acknowledged record is on
two nodes at least: SIGKILL any one node and nothing acknowledged is lost.

Plain listeners only (``--secure`` is the single broker's, ``dev/kafka.py``).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from trainguard.bus.config import KafkaConfig
from trainguard.dev.kafka import (
    _LOG4J,
    KAFKA_VERSION,
    BrokerError,
    KafkaBroker,
    _kafka_uuid,
    _signal_group,
    _tail,
    fetch_kafka,
    free_port,
    server_properties,
    wait_until_ready,
)
from trainguard.dev.paths import state_dir
from trainguard.dev.procs import alive

# A killed node's partitions get new leaders once the controllers fence it: 4 s instead of
# Kafka's 9 s (a heartbeat every 0.5 s). bench/bench_failover.py, longest acks=all stall: 7.6
# and 7.8 s with 9 s; with 3 s once 3.2 s and once 7.6 s (cause not found).
SESSION_TIMEOUT_MS = 4000


@dataclass(frozen=True)
class NodeInfo:
    node_id: int
    pid: int
    port: int
    controller_port: int

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True)
class ClusterInfo:
    nodes: tuple[NodeInfo, ...]
    state_dir: str
    started_at: float
    replication_factor: int
    min_insync_replicas: int
    version: str = KAFKA_VERSION

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, node_id: int) -> NodeInfo:
        for n in self.nodes:
            if n.node_id == node_id:
                return n
        raise KeyError(f"no node {node_id} in the cluster under {self.state_dir}")

    def client_config(self, *, topic_prefix: str = "tg",
                      client_id: str = "trainguard") -> KafkaConfig:
        return KafkaConfig(bootstrap=self.bootstrap, topic_prefix=topic_prefix,
                           client_id=client_id, replication_factor=self.replication_factor,
                           min_insync_replicas=self.min_insync_replicas)

    def client_env(self, topic_prefix: str = "tg") -> dict[str, str]:
        return {"TRAINGUARD_KAFKA_BOOTSTRAP": self.bootstrap,
                "TRAINGUARD_KAFKA_TOPIC_PREFIX": topic_prefix,
                "TRAINGUARD_KAFKA_REPLICATION_FACTOR": str(self.replication_factor),
                "TRAINGUARD_KAFKA_MIN_INSYNC_REPLICAS": str(self.min_insync_replicas)}

    @classmethod
    def from_json(cls, raw: str) -> ClusterInfo:
        data = json.loads(raw)
        data["nodes"] = tuple(NodeInfo(**n) for n in data["nodes"])
        return cls(**data)


class KafkaCluster:
    """``size`` combined nodes under one state directory."""

    def __init__(self, root: Path | None = None, *, size: int = 3, heap: str = "384m",
                 min_insync: int | None = None) -> None:
        if size < 1:
            raise BrokerError(f"a cluster needs at least one node (got {size})")
        self.root = root or (state_dir() / "kafka")  # the same place as the single broker
        self.size = size
        self.heap = heap
        self.min_insync = min_insync if min_insync is not None else max(1, min(2, size - 1))
        if not 1 <= self.min_insync <= size:
            raise BrokerError(f"min.insync.replicas must be between 1 and {size} "
                              f"(got {self.min_insync})")

    @property
    def info_file(self) -> Path:
        return self.root / "cluster.json"

    def node_dir(self, node_id: int) -> Path:
        return self.root / f"node-{node_id}"

    def info(self) -> ClusterInfo | None:
        try:
            return ClusterInfo.from_json(self.info_file.read_text())
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def running(self) -> ClusterInfo | None:
        """The cluster if any of its nodes runs (a node may be down on purpose)."""
        info = self.info()
        if info is None or not any(alive(n.pid) for n in info.nodes):
            return None
        return info

    def _java(self, node_id: int) -> list[str]:
        lib = fetch_kafka()
        log4j = self.node_dir(node_id) / "log4j.properties"
        return ["java", f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC",
                "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
                f"-Dlog4j.configuration=file:{log4j}", "-cp", f"{lib}/*"]

    def start(self, *, fresh: bool = False, timeout_s: float = 180.0) -> ClusterInfo:
        single = KafkaBroker(self.root)
        if single.info_file.exists() and not self.info_file.exists():
            if single.running() is not None:
                raise BrokerError(f"a single broker runs under {self.root}: stop it first")
            fresh = True  # its data is not a cluster's
        current = self.running()
        if current is not None and not fresh:
            return current
        if current is not None:
            self.stop()
        fetch_kafka()
        previous = self.info()
        keep = (not fresh and previous is not None and len(previous.nodes) == self.size
                and all((self.node_dir(n.node_id) / "data" / "meta.properties").exists()
                        for n in previous.nodes))
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        if keep and previous is not None:
            ports = [(n.port, n.controller_port) for n in previous.nodes]
            replication, min_insync = previous.replication_factor, previous.min_insync_replicas
        else:
            ports = [(free_port(), free_port()) for _ in range(self.size)]
            replication, min_insync = self.size, self.min_insync
        voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_p, c) in enumerate(ports))
        cluster_id = _kafka_uuid()
        for i, (port, cport) in enumerate(ports):
            node_id = i + 1
            home = self.node_dir(node_id)
            home.mkdir(parents=True, exist_ok=True)
            (home / "log4j.properties").write_text(_LOG4J.format(log=home / "kafka-server.log"))
            props = home / "server.properties"
            props.write_text(server_properties(home / "data", port, cport, node_id=node_id,
                                               voters=voters, replication=replication,
                                               min_insync=min_insync,
                                               session_timeout_ms=SESSION_TIMEOUT_MS))
            if not keep:
                fmt = subprocess.run([*self._java(node_id), "kafka.tools.StorageTool", "format",
                                      f"--cluster-id={cluster_id}", "-c", str(props)],
                                     capture_output=True, text=True)
                if fmt.returncode != 0:
                    raise BrokerError(f"formatting node {node_id} failed:\n"
                                      f"{fmt.stdout}{fmt.stderr}")
        nodes = tuple(NodeInfo(node_id=i + 1, pid=self._spawn(i + 1), port=p, controller_port=c)
                      for i, (p, c) in enumerate(ports))
        info = ClusterInfo(nodes=nodes, state_dir=str(self.root), started_at=time.time(),
                           replication_factor=replication, min_insync_replicas=min_insync)
        self._save(info)
        try:
            for node in nodes:  # every node answers, so the quorum and all brokers are up
                wait_until_ready(node.bootstrap, timeout_s)
        except BrokerError:
            self.stop()
            raise BrokerError(f"the cluster did not become ready in {timeout_s:.0f}s; last "
                              f"log lines of node 1:\n"
                              f"{_tail(self.node_dir(1) / 'broker.log')}") from None
        return info

    def _spawn(self, node_id: int) -> int:
        home = self.node_dir(node_id)
        with open(home / "broker.log", "ab") as log:
            proc = subprocess.Popen([*self._java(node_id), "kafka.Kafka",
                                     str(home / "server.properties")],
                                    stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        return proc.pid

    def _save(self, info: ClusterInfo) -> None:
        self.info_file.write_text(json.dumps(asdict(info)))

    def kill_node(self, node_id: int) -> bool:
        """SIGKILL one node, as a crash would; True if it was running."""
        info = self.info()
        if info is None:
            return False
        node = info.node(node_id)
        if not alive(node.pid):
            return False
        _signal_group(node.pid, signal.SIGKILL)
        while alive(node.pid):
            time.sleep(0.05)
        return True

    def restart_node(self, node_id: int, timeout_s: float = 120.0) -> NodeInfo:
        """Start a stopped node again on its data and ports; return once it answers."""
        info = self.info()
        if info is None:
            raise BrokerError(f"no cluster under {self.root}")
        node = info.node(node_id)
        if alive(node.pid):
            return node
        fresh = NodeInfo(node_id, self._spawn(node_id), node.port, node.controller_port)
        self._save(ClusterInfo(
            nodes=tuple(fresh if n.node_id == node_id else n for n in info.nodes),
            state_dir=info.state_dir, started_at=info.started_at,
            replication_factor=info.replication_factor,
            min_insync_replicas=info.min_insync_replicas, version=info.version))
        wait_until_ready(fresh.bootstrap, timeout_s)
        return fresh

    def stop(self, grace_s: float = 30.0) -> bool:
        """Stop every node (SIGTERM, SIGKILL after a grace); True if any ran. Keeps data."""
        info = self.info()
        if info is None:
            return False
        running = [n for n in info.nodes if alive(n.pid)]
        for n in running:
            _signal_group(n.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(alive(n.pid) for n in running):
            time.sleep(0.1)
        for n in running:
            if alive(n.pid):
                _signal_group(n.pid, signal.SIGKILL)
                while alive(n.pid):
                    time.sleep(0.05)
        return bool(running)

    def kill(self) -> bool:
        info = self.info()
        if info is None:
            return False
        return any([self.kill_node(n.node_id) for n in info.nodes])
