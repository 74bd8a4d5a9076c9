"""A real single-node Apache Kafka (KRaft, broker+controller in one JVM) for development,
tests and the demo.

Kafka's jars come from Maven Central (``org.apache.kafka:kafka_2.13`` with a reload4j logging
backend), fetched once with Maven into the cache. The broker runs as a plain process in its own
session, its state (config, data, log, pid) in a state directory; ``start`` waits until it
accepts clients and ``stop`` stops it cleanly (SIGTERM, SIGKILL after a grace period).
A stopped broker restarted without ``fresh`` keeps its data and its ports, so tests and drills
can take the control plane away and bring it back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from trainguard.dev.paths import cache_dir, state_dir
from trainguard.dev.toolchain import ensure_java_and_maven

KAFKA_VERSION = "3.9.1"
SLF4J_VERSION = "1.7.36"
RELOAD4J_VERSION = "1.2.25"

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>trainguard.dev</groupId><artifactId>kafka-runtime</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId>
      <version>{slf4j}</version></dependency>
    <dependency><groupId>ch.qos.reload4j</groupId><artifactId>reload4j</artifactId>
      <version>{reload4j}</version></dependency>
  </dependencies>
</project>
"""

_LOG4J = """log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File={log}
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.server.KafkaServer=INFO
log4j.logger.kafka.server.BrokerServer=INFO
"""


class BrokerError(RuntimeError):
    pass


@dataclass(frozen=True)
class BrokerInfo:
    pid: int
    port: int
    controller_port: int
    state_dir: str
    started_at: float
    version: str = KAFKA_VERSION

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"


def kafka_lib_dir() -> Path:
    return cache_dir() / f"kafka-{KAFKA_VERSION}" / "lib"


def fetch_kafka() -> Path:
    """The directory of Kafka's jars, fetched with Maven the first time."""
    lib = kafka_lib_dir()
    marker = lib / ".complete"
    if marker.exists():
        return lib
    ensure_java_and_maven()
    lib.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="trainguard-kafka-pom-") as tmp:
        pom = Path(tmp) / "pom.xml"
        pom.write_text(_POM.format(kafka=KAFKA_VERSION, slf4j=SLF4J_VERSION,
                                   reload4j=RELOAD4J_VERSION))
        cmd = ["mvn", "-B", "-q", "-f", str(pom), "dependency:copy-dependencies",
               f"-DoutputDirectory={lib}", "-DincludeScope=runtime"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BrokerError(f"fetching Kafka {KAFKA_VERSION} with Maven failed:\n"
                              f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    if not any(lib.glob(f"kafka_2.13-{KAFKA_VERSION}.jar")):
        raise BrokerError(f"Maven finished but kafka_2.13-{KAFKA_VERSION}.jar is not in {lib}")
    marker.write_text(KAFKA_VERSION)
    return lib


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_properties(data_dir: Path, port: int, controller_port: int) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        # Single node: internal topics cannot have more replicas than brokers.
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Topics come from the registry, never from a typo in a producer.
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "log.retention.hours": "-1",
        "delete.topic.enable": "true",
    }
    return "".join(f"{k}={v}\n" for k, v in settings.items())


class KafkaBroker:
    """One broker under one state directory."""

    def __init__(self, root: Path | None = None, heap: str = "512m") -> None:
        self.root = root or (state_dir() / "kafka")
        self.heap = heap

    @property
    def info_file(self) -> Path:
        return self.root / "broker.json"

    @property
    def log_file(self) -> Path:
        return self.root / "broker.log"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    def info(self) -> BrokerInfo | None:
        try:
            return BrokerInfo(**json.loads(self.info_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def running(self) -> BrokerInfo | None:
        info = self.info()
        if info is None or not _alive(info.pid):
            return None
        return info

    def start(self, *, fresh: bool = False, timeout_s: float = 90.0) -> BrokerInfo:
        current = self.running()
        if current is not None and not fresh:
            return current
        if current is not None:
            self.stop()
        lib = fetch_kafka()
        previous = self.info()
        keep_data = (not fresh and previous is not None
                     and (self.data_dir / "meta.properties").exists())
        if not keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        port = previous.port if keep_data and previous else free_port()
        cport = previous.controller_port if keep_data and previous else free_port()
        props = self.root / "server.properties"
        props.write_text(server_properties(self.data_dir, port, cport))
        log4j = self.root / "log4j.properties"
        log4j.write_text(_LOG4J.format(log=self.root / "kafka-server.log"))
        java = ["java", f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC",
                "-Djava.awt.headless=true", f"-Dlog4j.configuration=file:{log4j}",
                "-cp", f"{lib}/*"]
        if not keep_data:
            cluster_id = _kafka_uuid()
            fmt = subprocess.run(
                [*java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)],
                capture_output=True, text=True)
            if fmt.returncode != 0:
                raise BrokerError(f"formatting KRaft storage failed:\n{fmt.stdout}{fmt.stderr}")
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen([*java, "kafka.Kafka", str(props)], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        info = BrokerInfo(pid=proc.pid, port=port, controller_port=cport,
                          state_dir=str(self.root), started_at=time.time())
        self.info_file.write_text(json.dumps(asdict(info)))
        try:
            wait_until_ready(info.bootstrap, timeout_s, proc)
        except BrokerError:
            self.stop()
            raise BrokerError(f"broker did not become ready in {timeout_s:.0f}s; last log "
                              f"lines:\n{_tail(self.log_file)}") from None
        return info

    def stop(self, grace_s: float = 30.0) -> bool:
        """Stop the broker; True if one was running. Keeps data (and ports) for a restart."""
        info = self.running()
        if info is None:
            return False
        _signal_group(info.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _alive(info.pid):
            time.sleep(0.1)
        if _alive(info.pid):
            _signal_group(info.pid, signal.SIGKILL)
            while _alive(info.pid):
                time.sleep(0.05)
        return True

    def kill(self) -> bool:
        """Take the broker away hard (SIGKILL), as a crash would."""
        info = self.running()
        if info is None:
            return False
        _signal_group(info.pid, signal.SIGKILL)
        while _alive(info.pid):
            time.sleep(0.05)
        return True


def _kafka_uuid() -> str:
    """A cluster id as StorageTool wants it: 16 random bytes, url-safe base64, no padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _alive(pid: int) -> bool:
    try:
        done, _status = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1][:1] != "Z"
    except OSError:
        return False


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_until_ready(bootstrap: str, timeout_s: float,
                     proc: subprocess.Popen[bytes] | None = None) -> None:
    """Block until the broker answers a metadata request and can host a group coordinator."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"broker exited with {proc.returncode}")
        if asyncio.run(_answers(bootstrap)):
            return
        time.sleep(0.5)
    raise BrokerError(f"broker at {bootstrap} not ready after {timeout_s:.0f}s")


async def _answers(bootstrap: str) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # connection refusals are expected while it boots
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
    try:
        await asyncio.wait_for(admin.start(), 5)
        await asyncio.wait_for(admin.list_topics(), 5)
        return True
    except (KafkaError, OSError, TimeoutError):
        return False
    finally:
        try:
            await admin.close()
        except Exception:
            pass
        quiet.setLevel(level)
