"""The whole loop on this machine as plain processes: broker, topics, node agent, streams,
decision service, incident service, and one actuator per job. Used by drills and reusable by
the demo::

    with LocalStack(root, prefix="drill42") as stack:       # broker started (or reused)
        stack.start_services()                             # agent, streams, decide, incidents
        stack.start_actuator(job_spec_path, launch=True)   # launches the job's ranks
        ...
        stack.stop_actuator(job_id)
    # every process this stack started is stopped (SIGTERM, then SIGKILL after a grace)

Each service is ``python -m trainguard.cli.main <command> ...`` in its own session, its output
in ``<root>/logs/<name>.log``. Nothing is hidden: ``stack.services`` lists what runs, with
pids and log files. The signing keys are made for the stack by ``signing.generate`` in
``<root>/keys`` (private keys mode 0600): decide gets the command key and the trusted actuator
public keys, each actuator decide's public key and an actuator key.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from trainguard.actuators import signing
from trainguard.bus.admin import ensure_topics
from trainguard.bus.config import KafkaConfig
from trainguard.dev.kafka import BrokerInfo, KafkaBroker
from trainguard.dev.paths import unix_socket_path
from trainguard.events.topics import TOPIC_SPECS, TopicNames

Say = Callable[[str], None]


class StackError(RuntimeError):
    pass


@dataclass
class Service:
    """One supervised process."""

    name: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         env={**os.environ, **self.env})

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM to its process group, SIGKILL after ``grace_s``; its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class LocalStack:
    def __init__(self, root: Path, *, prefix: str, node: str = "drill-node",
                 broker: KafkaBroker | None = None, say: Say = print,
                 partitions: int = 3) -> None:
        self.root = root
        self.prefix = prefix
        self.node = node
        self.broker = broker or KafkaBroker()
        self.say = say
        self.partitions = partitions
        self.services: dict[str, Service] = {}
        self.revived: list[tuple[str, int | None]] = []  # (service, its exit code)
        self.info: BrokerInfo | None = None
        self.broker_was_running = False
        self.keys = root / "keys"  # `trainguard keys gen`: decide's and the actuators' keys
        self.agent_socket = unix_socket_path(root / "agent.sock")  # short, however deep root

    # --- lifecycle ------------------------------------------------------------------------

    def __enter__(self) -> LocalStack:
        self.root.mkdir(parents=True, exist_ok=True)
        self.broker_was_running = self.broker.running() is not None
        self.info = self.broker.start()
        self.say(f"[stack] Kafka at {self.info.bootstrap} (pid {self.info.pid}"
                 f"{', reused' if self.broker_was_running else ''})")
        asyncio.run(ensure_topics(self.config(), TopicNames(self.prefix),
                                  partitions={s.role: self.partitions for s in TOPIC_SPECS}))
        if not (self.keys / signing.COMMAND_KEY).exists():
            signing.generate(self.keys)
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop_all()

    def config(self, client_id: str = "trainguard-drill") -> KafkaConfig:
        info = self.broker.running() or self.info
        if info is None:
            raise StackError("no broker")
        return KafkaConfig(bootstrap=info.bootstrap, topic_prefix=self.prefix,
                           client_id=client_id)

    def trust_args(self) -> list[str]:
        """For the readers that believe actuator events (streams, replay)."""
        return ["--actuator-pubkeys", str(self.keys / signing.ACTUATOR_PUBS)]

    def decide_key_args(self) -> list[str]:
        return ["--command-key", str(self.keys / signing.COMMAND_KEY),
                "--actuator-pubkeys", str(self.keys / signing.ACTUATOR_PUBS)]

    def actuator_key_args(self) -> list[str]:
        return ["--command-pubkey", str(self.keys / signing.COMMAND_PUB),
                "--actuator-key", str(self.keys / signing.ACTUATOR_KEY),
                "--actuator-pubkeys", str(self.keys / signing.ACTUATOR_PUBS)]

    def cli(self, *args: str) -> list[str]:
        """The argv of ``trainguard ARGS`` against this stack's broker and prefix."""
        assert self.info is not None, "enter the stack first"
        return [sys.executable, "-m", "trainguard.cli.main", *args,
                "--bootstrap", self.info.bootstrap, "--prefix", self.prefix]

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Service:
        if name in self.services and self.services[name].alive():
            raise StackError(f"{name} is already running (pid {self.services[name].pid})")
        svc = Service(name, argv, self.root / "logs" / f"{name}.log", env or {})
        svc.start()
        self.services[name] = svc
        self.say(f"[stack] {name} started (pid {svc.pid}, log {svc.log})")
        return svc

    # --- the services ---------------------------------------------------------------------

    def start_service(self, name: str, args: Sequence[str],
                      env: dict[str, str] | None = None) -> Service:
        """Any other ``trainguard`` service (alerts, metrics) under this stack's supervision."""
        return self._start(name, self.cli(*args), env)

    def start_agent(self, interval_s: float = 0.5) -> Service:
        svc = self._start("agent", [*self.cli(
            "agent", "--node", self.node, "--interval-s", str(interval_s), "--metrics-port", "0",
            "--gpu", "none", "--no-kernel-log", "--spool-dir", str(self.root / "spool"),
            "--socket", str(self.agent_socket))])
        deadline = time.monotonic() + 60
        while not self.agent_socket.exists():
            if not svc.alive() or time.monotonic() > deadline:
                raise StackError(f"the agent did not open {self.agent_socket}:\n{svc.tail()}")
            time.sleep(0.1)
        return svc

    def start_streams(self) -> Service:
        return self._start("streams", self.cli(
            "streams", "--data-dir", str(self.root / "streams"), *self.trust_args()))

    def start_decide(self, window_s: float = 3.0, settle_s: float = 1.5) -> Service:
        return self._start("decide", self.cli(
            "decide", *self.decide_key_args(), "--window-s", str(window_s),
            "--settle-s", str(settle_s), "--outcome-timeout-s", "120"))

    def start_incidents(self) -> Service:
        return self._start("incidents", self.cli(
            "incident", "serve", "--idle-flush-s", "2", "--lateness-ms", "5000",
            "--command-pubkey", str(self.keys / signing.COMMAND_PUB), "--actuator-pubkeys",
            str(self.keys / signing.ACTUATOR_PUBS)))

    def start_services(self, names: Sequence[str] = ("agent", "streams", "decide",
                                                     "incidents")) -> None:
        starters = {"agent": self.start_agent, "streams": self.start_streams,
                    "decide": self.start_decide, "incidents": self.start_incidents}
        for name in names:
            starters[name]()

    def actuator_dir(self, job_id: str) -> Path:
        return self.root / f"actuator-{job_id}"

    def start_actuator(self, job_id: str, job_spec: Path, *, launch: bool = True,
                       extra: Sequence[str] = (), env: dict[str, str] | None = None) -> Service:
        """``extra``: more arguments (``--backend slurm --slurm-job N``); ``env``: more
        environment (``SLURM_CONF``)."""
        args = ["actuator", "--job-spec", str(job_spec), "--state-dir",
                str(self.actuator_dir(job_id)), *self.actuator_key_args(), *extra]
        if launch:
            args.append("--launch")
        return self._start(f"actuator-{job_id}", self.cli(*args), env)

    def stop(self, name: str, grace_s: float = 10.0) -> int | None:
        """Stop one service; it is no longer listed."""
        svc = self.services.pop(name, None)
        return svc.stop(grace_s) if svc else None

    def dead(self) -> list[Service]:
        """Services that ended on their own (not stopped through ``stop``)."""
        return [s for s in self.services.values() if s.proc is not None and not s.alive()]

    def revive(self) -> list[str]:
        """Start again every service that ended on its own (a supervisor's job: systemd or
        Kubernetes would restart it); the names, each also said and kept in ``revived``."""
        names = []
        for svc in self.dead():
            code = svc.proc.returncode if svc.proc else None
            self.say(f"[stack] {svc.name} ended on its own (exit {code}); starting it again. "
                     f"Last lines:\n{svc.tail(5)}")
            svc.start()
            names.append(svc.name)
            self.revived.append((svc.name, code))
        return names

    def stop_all(self) -> None:
        # actuators first (they own the ranks), the agent last (it spools what is left)
        order = sorted(self.services.values(),
                       key=lambda s: (not s.name.startswith("actuator"), s.name == "agent"))
        for svc in order:
            code = svc.stop()
            if code is not None:
                self.say(f"[stack] {svc.name} stopped (exit {code})")
        if not self.broker_was_running:
            self.broker.stop()
            self.say("[stack] Kafka stopped")
