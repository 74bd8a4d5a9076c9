"""A real single-node Apache Kafka (KRaft, broker+controller in one JVM) for development,
tests and the demo.

Kafka's jars come from Maven Central (``org.apache.kafka:kafka_2.13`` with a reload4j logging
backend), fetched once with Maven into the cache. The broker runs as a plain process in its own
session, its state (config, data, log, pid) in a state directory; ``start`` waits until it
accepts clients and ``stop`` stops it cleanly (SIGTERM, SIGKILL after a grace period).
A stopped broker restarted without ``fresh`` keeps its data and its ports, so tests and drills
can take the control plane away and bring it back.

``secure``: the client listener is SASL_SSL with SCRAM-SHA-512, the StandardAuthorizer denies
what no ACL allows, and every service of the topic registry gets its own principal
(``bus/acl.py``). The passwords are generated at format time, bootstrapped into the metadata
with ``StorageTool format --add-scram`` and written to ``<state>/credentials/<user>.password``
(mode 0600) for the services to read through ``TRAINGUARD_KAFKA_SASL_PASSWORD_FILE``; a fresh
CA signs the broker's certificate (``dev/tls.py``), which clients verify with
``TRAINGUARD_KAFKA_SSL_CAFILE``. The controller listener takes only the admin (SASL/PLAIN over
TLS: KRaft cannot use SCRAM there). See docs/security-broker.md.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from trainguard.bus.acl import ADMIN_USER
from trainguard.bus.config import KafkaConfig
from trainguard.dev.paths import cache_dir, state_dir
from trainguard.dev.procs import alive
from trainguard.dev.tls import TlsFiles, make_tls_files, tls_files
from trainguard.dev.toolchain import ensure_java_and_maven
from trainguard.events.topics import Service

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
    secure: bool = False

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def credentials_dir(self) -> Path:
        return Path(self.state_dir) / "credentials"

    def tls(self) -> TlsFiles:
        return tls_files(Path(self.state_dir) / "tls")

    def client_config(self, user: Service | str, *, topic_prefix: str = "tg",
                      client_id: str = "trainguard") -> KafkaConfig:
        """How ``user`` (a service, or the admin) reaches this broker; PLAINTEXT if not secure."""
        if not self.secure:
            return KafkaConfig(bootstrap=self.bootstrap, topic_prefix=topic_prefix,
                               client_id=client_id)
        name = str(user.value if isinstance(user, Service) else user)
        return KafkaConfig(bootstrap=self.bootstrap, security_protocol="SASL_SSL",
                           sasl_mechanism=SCRAM, sasl_username=name,
                           sasl_password=read_password(self.credentials_dir(), name),
                           ssl_cafile=str(self.tls().ca),
                           topic_prefix=topic_prefix, client_id=client_id)

    def client_env(self, user: Service | str, topic_prefix: str = "tg") -> dict[str, str]:
        """The ``TRAINGUARD_KAFKA_*`` settings that make a service connect as ``user``."""
        env = {"TRAINGUARD_KAFKA_BOOTSTRAP": self.bootstrap,
               "TRAINGUARD_KAFKA_TOPIC_PREFIX": topic_prefix}
        if self.secure:
            name = str(user.value if isinstance(user, Service) else user)
            env.update({
                "TRAINGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
                "TRAINGUARD_KAFKA_SSL_CAFILE": str(self.tls().ca),
                "TRAINGUARD_KAFKA_SASL_MECHANISM": SCRAM,
                "TRAINGUARD_KAFKA_SASL_USERNAME": name,
                "TRAINGUARD_KAFKA_SASL_PASSWORD_FILE": str(self.credentials_dir()
                                                           / f"{name}.password"),
            })
        return env


SCRAM = "SCRAM-SHA-512"
# Principals with a password on a secured broker: the super user, then one per service.
USERS: tuple[str, ...] = (ADMIN_USER, *(s.value for s in Service))


def write_passwords(directory: Path) -> dict[str, str]:
    """A fresh random password per user, each in its own file only its owner can read."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    out: dict[str, str] = {}
    for user in USERS:
        password = secrets.token_urlsafe(24)
        path = directory / f"{user}.password"
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(password + "\n")
        out[user] = password
    return out


def read_password(directory: Path, user: str) -> str:
    path = directory / f"{user}.password"
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise BrokerError(f"{path}: cannot read the password of {user!r} "
                          f"({exc.strerror})") from None


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


def server_properties(data_dir: Path, port: int, controller_port: int,
                      admin_password: str | None = None, tls: TlsFiles | None = None, *,
                      node_id: int = 1, voters: str | None = None, replication: int = 1,
                      min_insync: int = 1, session_timeout_ms: int | None = None,
                      overrides: Mapping[str, str] | None = None) -> str:
    """The broker's config; with ``admin_password`` and ``tls`` the secured variant (see the
    module doc). ``node_id``, ``voters`` (``id@host:port,...``), ``replication`` and
    ``min_insync``, ``session_timeout_ms``: one node of a multi-node cluster
    (``dev/cluster.py``). ``overrides``: properties that win over all of these (a broker
    configured from elsewhere, e.g. docker-compose.yml's ``KAFKA_*`` settings)."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters or f"{node_id}@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        # Internal topics as replicated as the topics: 1 on the single broker (no more
        # replicas than brokers), N with min.insync 2 on a cluster.
        "offsets.topic.replication.factor": str(replication),
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": str(replication),
        "transaction.state.log.min.isr": str(min_insync),
        "transaction.state.log.num.partitions": "4",
        "default.replication.factor": str(replication),
        "min.insync.replicas": str(min_insync),
        "group.initial.rebalance.delay.ms": "0",
        # Topics come from the registry, never from a typo in a producer.
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "log.retention.hours": "-1",
        "delete.topic.enable": "true",
    }
    if session_timeout_ms is not None:
        # How long the controllers wait for a silent broker before they fence it and move
        # its partitions' leadership (Kafka's default: 9 s, heartbeats every 2 s).
        settings["broker.session.timeout.ms"] = str(session_timeout_ms)
        settings["broker.heartbeat.interval.ms"] = str(max(100, session_timeout_ms // 8))
    if admin_password is not None:
        if tls is None:
            raise BrokerError("a secured broker needs its TLS files")
        settings.update(_secure_settings(port, controller_port, admin_password, tls))
    settings.update(overrides or {})
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def _secure_settings(port: int, controller_port: int, admin_password: str,
                     tls: TlsFiles) -> dict[str, str]:
    scram = ("org.apache.kafka.common.security.scram.ScramLoginModule required "
             f'username="{ADMIN_USER}" password="{admin_password}";')
    plain = ("org.apache.kafka.common.security.plain.PlainLoginModule required "
             f'username="{ADMIN_USER}" password="{admin_password}" '
             f'user_{ADMIN_USER}="{admin_password}";')
    return {
        "listeners": f"CLIENT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"CLIENT://127.0.0.1:{port}",
        "inter.broker.listener.name": "CLIENT",
        "listener.security.protocol.map": "CLIENT:SASL_SSL,CONTROLLER:SASL_SSL",
        # The broker's key and chain; the CA for its own connections to itself.
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(tls.keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca),
        "ssl.client.auth": "none",
        "sasl.enabled.mechanisms": SCRAM,
        "sasl.mechanism.inter.broker.protocol": SCRAM,
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.client.sasl.enabled.mechanisms": SCRAM,
        f"listener.name.client.{SCRAM.lower()}.sasl.jaas.config": scram,
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": plain,
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{ADMIN_USER}",
    }


class KafkaBroker:
    """One broker under one state directory. ``overrides``, ``port``, ``controller_port``: a
    broker configured from elsewhere (its properties win over the generated ones; its client
    and controller ports instead of free ones)."""

    def __init__(self, root: Path | None = None, heap: str = "512m", *,
                 overrides: Mapping[str, str] | None = None, port: int | None = None,
                 controller_port: int | None = None) -> None:
        self.root = root or (state_dir() / "kafka")
        self.heap = heap
        self.overrides = dict(overrides or {})
        self.port = port
        self.controller_port = controller_port

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
        if info is None or not alive(info.pid):
            return None
        return info

    @property
    def credentials_dir(self) -> Path:
        return self.root / "credentials"

    def start(self, *, fresh: bool = False, timeout_s: float = 90.0,
              secure: bool | None = None) -> BrokerInfo:
        """``secure``: None keeps what the existing data was formatted with (plain if new);
        a broker is secured (or not) when its storage is formatted, so a change needs
        ``fresh``."""
        if (self.root / "cluster.json").exists():
            from trainguard.dev.cluster import KafkaCluster

            if not fresh or KafkaCluster(self.root).running() is not None:
                raise BrokerError(f"{self.root} holds a multi-node cluster (stop it and start "
                                  "with --fresh, or use another --state-dir)")
            shutil.rmtree(self.root)
        current = self.running()
        if current is not None and not fresh:
            if secure is not None and secure != current.secure:
                raise BrokerError(f"the broker under {self.root} runs "
                                  f"{'secured' if current.secure else 'without security'}: "
                                  "stop it, or start it with --fresh")
            return current
        if current is not None:
            self.stop()
        lib = fetch_kafka()
        previous = self.info()
        keep_data = (not fresh and previous is not None
                     and (self.data_dir / "meta.properties").exists())
        if keep_data and previous is not None and secure is not None \
                and secure != previous.secure:
            raise BrokerError(f"the data under {self.root} was formatted "
                              f"{'secured' if previous.secure else 'without security'}: "
                              "start it with --fresh to change that")
        if keep_data and previous is not None:
            secure = previous.secure
        secure = bool(secure)
        if not keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)
        port = previous.port if keep_data and previous else (self.port or free_port())
        cport = (previous.controller_port if keep_data and previous
                 else (self.controller_port or free_port()))
        passwords: dict[str, str] = {}
        tls: TlsFiles | None = None
        if secure and not keep_data:
            passwords = write_passwords(self.credentials_dir)
            tls = make_tls_files(self.root / "tls")
        elif secure:
            passwords = {ADMIN_USER: read_password(self.credentials_dir, ADMIN_USER)}
            tls = tls_files(self.root / "tls")
        props = self.root / "server.properties"
        props.unlink(missing_ok=True)  # it holds the admin password when secured: 0600
        fd = os.open(props, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(server_properties(self.data_dir, port, cport,
                                       passwords.get(ADMIN_USER), tls,
                                       overrides=self.overrides))
        log4j = self.root / "log4j.properties"
        log4j.write_text(_LOG4J.format(log=self.root / "kafka-server.log"))
        java = ["java", f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseG1GC",
                "-Djava.awt.headless=true", f"-Dlog4j.configuration=file:{log4j}",
                "-cp", f"{lib}/*"]
        if not keep_data:
            cluster_id = _kafka_uuid()
            scram = [arg for user, password in passwords.items()
                     for arg in ("--add-scram", f"{SCRAM}=[name={user},password={password}]")]
            fmt = subprocess.run(
                [*java, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
                 "-c", str(props),
                 *scram], capture_output=True, text=True)
            if fmt.returncode != 0:
                raise BrokerError(f"formatting KRaft storage failed:\n{fmt.stdout}{fmt.stderr}")
        with open(self.log_file, "ab") as log:
            proc = subprocess.Popen([*java, "kafka.Kafka", str(props)], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        info = BrokerInfo(pid=proc.pid, port=port, controller_port=cport,
                          state_dir=str(self.root), started_at=time.time(), secure=secure)
        self.info_file.write_text(json.dumps(asdict(info)))
        try:
            wait_until_ready(info.client_config(ADMIN_USER), timeout_s, proc)
        except BrokerError:
            self.stop()
            raise BrokerError(f"broker did not become ready in {timeout_s:.0f}s; last log "
                              f"lines:\n{_tail(self.log_file)}") from None
        return info

    def grant(self, prefix: str) -> int:
        """Create the registry's ACLs for the topics under ``prefix``; how many rules."""
        from trainguard.bus.acl import acl_bindings
        from trainguard.bus.admin import apply_acls

        info = self.running()
        if info is None or not info.secure:
            raise BrokerError(f"no secured broker runs under {self.root}")
        bindings = acl_bindings(prefix)
        asyncio.run(apply_acls(info.client_config(ADMIN_USER), bindings))
        return len(bindings)

    def stop(self, grace_s: float = 30.0) -> bool:
        """Stop the broker; True if one was running. Keeps data (and ports) for a restart."""
        info = self.running()
        if info is None:
            return False
        _signal_group(info.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and alive(info.pid):
            time.sleep(0.1)
        if alive(info.pid):
            _signal_group(info.pid, signal.SIGKILL)
            while alive(info.pid):
                time.sleep(0.05)
        return True

    def kill(self) -> bool:
        """Take the broker away hard (SIGKILL), as a crash would."""
        info = self.running()
        if info is None:
            return False
        _signal_group(info.pid, signal.SIGKILL)
        while alive(info.pid):
            time.sleep(0.05)
        return True


def _kafka_uuid() -> str:
    """A cluster id as StorageTool wants it: 16 random bytes, url-safe base64, no padding.
    One in 64 starts with ``-``: pass it as ``--cluster-id=ID``, never as a separate argument
    (argparse would take it for an option)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


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


def wait_until_ready(target: str | KafkaConfig, timeout_s: float,
                     proc: subprocess.Popen[bytes] | None = None) -> None:
    """Block until the broker answers a metadata request and can host a group coordinator.

    ``target``: a bootstrap address (plaintext), or the config to connect with."""
    cfg = target if isinstance(target, KafkaConfig) else KafkaConfig(bootstrap=target)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"broker exited with {proc.returncode}")
        if asyncio.run(_answers(cfg)):
            return
        time.sleep(0.5)
    raise BrokerError(f"broker at {cfg.bootstrap} not ready after {timeout_s:.0f}s")


async def _answers(cfg: KafkaConfig) -> bool:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # connection refusals are expected while it boots
    admin = AIOKafkaAdminClient(**cfg.client_kwargs(), request_timeout_ms=3000)
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
