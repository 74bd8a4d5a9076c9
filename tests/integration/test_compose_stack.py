"""What docker-compose.yml would run is what runs here: the stack is derived from the compose
file itself (``compose_stack``: same commands, environment, secrets, volumes, ports and Kafka
listeners, through one explicit address/path mapping), started as plain processes: the
``keys`` set-up, Kafka (``dev/kafka.py`` from the ``KAFKA_*`` settings), ``topics-init`` to
completion, every trainguard service, Prometheus and Alertmanager from Debian's builds. Then:
every trainguard Prometheus target is up and bound beyond loopback, a rank of the job the
compose actuator launched is killed and its incident ends recovered, the alerts service posts
to Alertmanager, and ending the job leaves no incident open.

Services that cannot run here are skipped, each for the reason in ``SKIPPED``; a service added
to the compose file must be run here or given a reason. dcgm-exporter is no compose service
(one per GPU node, outside this file): the agent's ``--dcgm-url`` maps to a port nothing
serves here, as on a node without one, and the agent carries on without GPU samples."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
import yaml

from tests.integration.compose_stack import (
    KAFKA_IMAGE,
    ROOT,
    TRAINGUARD_IMAGE,
    Translation,
    condition,
    image,
    load,
)
from trainguard.actuators.jobspec import load_job_spec
from trainguard.bus.config import KafkaConfig
from trainguard.dev.kafka import KafkaBroker
from trainguard.drills.live import view
from trainguard.drills.logtail import LogTail
from trainguard.drills.stack import Service
from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentState, IncidentTransition, PoolUnit, UnitState

pytestmark = pytest.mark.integration

# Other images, run from this machine's build of their program, with the settings their
# image gives them and compose does not override (Debian's prometheus, prometheus-alertmanager).
PROGRAMS = {
    "prom/prometheus:": ("prometheus", {"--web.listen-address": ":9090",
                                        "--storage.tsdb.path": "/prometheus"}),
    # one Alertmanager: no gossip (in its container, port 9094 on its own network)
    "prom/alertmanager:": ("prometheus-alertmanager", {"--web.listen-address": ":9093",
                                                       "--storage.path": "/alertmanager",
                                                       "--cluster.listen-address": ""}),
}
SKIPPED = {
    "grafana": "an image only (grafana/grafana; no Grafana here); its dashboards are tested "
               "against the real Prometheus in test_prometheus_dashboards.py",
}
SETUP_PROFILE = "setup"
ENDS = {IncidentState.RECOVERED, IncidentState.ESCALATED, IncidentState.UNRECOVERABLE}


class Stack:
    def __init__(self, tr: Translation, logs: Path) -> None:
        self.tr = tr
        self.logs = logs
        self.services: dict[str, Service] = {}
        self.broker: KafkaBroker | None = None
        self.ended = False

    def run_once(self, name: str, timeout_s: float = 60) -> None:
        done = subprocess.run(self.tr.argv(name), env={**os.environ, **self.tr.env(name)},
                              capture_output=True, text=True, timeout=timeout_s, check=False)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"

    def start(self, name: str) -> None:
        svc = Service(name, self.tr.argv(name), self.logs / f"{name}.log", self.tr.env(name))
        svc.start()
        self.services[name] = svc

    def start_program(self, name: str, binary: str, defaults: dict[str, str]) -> None:
        path = shutil.which(binary)
        assert path is not None, f"{name}: {binary} is not installed (./tg installs it)"
        svc = Service(name, self.tr.image_argv(name, path, defaults),
                      self.logs / f"{name}.log")
        svc.start()
        self.services[name] = svc

    def start_kafka(self, name: str) -> KafkaBroker:
        props = self.tr.kafka(name)
        ns = self.tr.namespace(name)
        listeners = props["listeners"]
        client = int(listeners.split(",")[0].rsplit(":", 1)[1])
        controller = self.tr.port(ns, 9093) if "CONTROLLER" in listeners else None
        self.broker = KafkaBroker(self.tr.root / "kafka", overrides=props, port=client,
                                  controller_port=controller)
        self.broker.start(fresh=True, timeout_s=90)
        return self.broker

    def dead(self) -> list[str]:
        return [f"{s.name}:\n{s.tail()}" for s in self.services.values() if not s.alive()]

    def stop(self, name: str) -> None:
        svc = self.services.pop(name, None)
        if svc is not None:
            svc.stop()

    def end_job(self) -> subprocess.CompletedProcess[str] | None:
        """End the job as the demo does (decide and the agent first: the ranks' exits are not a
        fault), then the actuator's ``--teardown`` fences every replica. Once; None if the
        actuator never started."""
        if "actuator" not in self.services or self.ended:
            return None
        self.ended = True
        for name in ("decide", "agent", "actuator"):
            self.stop(name)
        return subprocess.run([*self.tr.argv("actuator"), "--teardown"],
                              env={**os.environ, **self.tr.env("actuator")},
                              capture_output=True, text=True, timeout=60, check=False)

    def stop_all(self) -> None:
        self.end_job()  # no rank outlives the test
        for name in list(self.services):
            self.stop(name)
        if self.broker is not None:
            self.broker.stop()


@pytest.fixture
def compose_stack() -> Iterator[Stack]:
    # Not under /tmp: the job's checkpoints sit on a volume, and the workload refuses scratch
    # directories. Short: the actuator's warm-launcher socket on its volume must fit a Unix
    # socket path (108 bytes), as /var/lib/trainguard/... does in the container.
    root = Path.home() / ".tg-compose" / uuid.uuid4().hex[:8]
    keys = root / "keys"
    tr = Translation(load({"TRAINGUARD_KEYS_DIR": str(keys)}), root)
    stack = Stack(tr, root / "logs")
    try:
        yield stack
    finally:
        stack.stop_all()
        if not os.environ.get("TG_KEEP_COMPOSE_TEST"):  # set it to look at the logs after
            tr.cleanup()


def _wait(ok: Callable[[], bool], limit_s: float, what: str, stack: Stack,
          failed: Callable[[], str | None] = lambda: None) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if ok():
            return
        why = failed() or "; ".join(stack.dead())
        assert not why, f"while waiting for {what}: {why}"
        time.sleep(0.3)
    raise AssertionError(f"gave up waiting {limit_s:.0f} s for {what}")


def _wait_page(url: str, stack: Stack, limit_s: float = 30) -> str:
    """The page at ``url`` once it names the incident recovered (it is folded live)."""
    body = ""

    def fetched() -> bool:
        nonlocal body
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                body = r.read().decode()
        except OSError:
            return False
        return "recovered" in body.lower()

    _wait(fetched, limit_s, f"the served timeline page {url}", stack)
    return body


def _trainguard_targets(api: str) -> set[str]:
    """The health of Prometheus's trainguard-* targets (5 expected: agent, metrics, decide,
    actuator, alerts); {"up"} when every one is."""
    with urllib.request.urlopen(api, timeout=10) as resp:
        active = json.loads(resp.read())["data"]["activeTargets"]
    mine = [t for t in active if t["labels"]["job"].startswith("trainguard-")]
    return {t["health"] for t in mine} if len(mine) >= 5 else {"missing"}


def _sent_to_alertmanager(url: str) -> float:
    with urllib.request.urlopen(url, timeout=10) as resp:
        lines = resp.read().decode().splitlines()
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines
               if ln.startswith("trainguard_alerts_messages_sent_total{")
               and 'channel="alertmanager"' in ln)


def _bound_pids(events: list[Event]) -> dict[int, int]:
    out: dict[int, int] = {}
    for e in events:
        p = e.payload
        if isinstance(p, PoolUnit) and p.state is UnitState.BOUND and p.pid and \
                p.rank is not None:
            out[p.rank] = p.pid
    return out


def _exited(pids: dict[int, int]) -> str | None:
    for rank, pid in sorted(pids.items()):
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                continue
        except psutil.Error:
            pass
        return f"rank {rank} (pid {pid}) exited before the job started"
    return None


def _incidents(events: list[Event], since_us: int) -> dict[str, IncidentState]:
    opened: dict[str, int] = {}
    latest: dict[str, IncidentState] = {}
    for e in events:
        if isinstance(e.payload, IncidentTransition):
            opened.setdefault(e.payload.incident_id, e.event_time)
            latest[e.payload.incident_id] = e.payload.to_state
    return {i: s for i, s in latest.items() if opened[i] >= since_us}


def test_the_compose_stack_recovers_a_killed_rank(compose_stack: Stack) -> None:
    stack, tr = compose_stack, compose_stack.tr
    services = tr.services()
    setup = [n for n, s in services.items() if SETUP_PROFILE in s.get("profiles", [])]
    assert setup == ["keys"], setup
    # the documented set-up step: the key set every secret of the file names
    stack.run_once("keys")
    for name, secret in tr.doc["secrets"].items():
        assert Path(secret["file"]).is_file(), (name, secret["file"])
    assert (Path(tr.doc["secrets"]["command-key"]["file"]).stat().st_mode & 0o077) == 0

    t0 = time.monotonic()
    started: list[str] = []
    for name in tr.start_order():
        svc = services[name]
        if name in setup:
            continue
        if name in SKIPPED:
            assert not image(svc).startswith(TRAINGUARD_IMAGE), name
            continue
        for dep in svc.get("depends_on", []):
            assert dep in started or dep in SKIPPED, (name, dep)
            if condition(svc, dep) == "service_healthy":
                assert dep == "kafka", (name, dep)  # healthy = KafkaBroker.start returned
        program = next((p for prefix, p in PROGRAMS.items() if image(svc).startswith(prefix)),
                       None)
        if image(svc).startswith(KAFKA_IMAGE):
            stack.start_kafka(name)
        elif program is not None:
            stack.start_program(name, *program)
        elif not image(svc).startswith(TRAINGUARD_IMAGE):
            raise AssertionError(f"service {name} ({image(svc)}): run it here or say in "
                                 "SKIPPED why it cannot be")
        elif svc.get("restart") == "no":
            stack.run_once(name)  # topics-init: to completion, as compose's one-shot
        else:
            stack.start(name)
        started.append(name)
    assert {"agent", "streams", "decide", "actuator", "incidents", "metrics",
            "alerts"} <= set(stack.services)
    # Kafka's forever-retained log on its volume (KAFKA_LOG_DIRS), not in a scratch directory
    assert (tr.mounts("kafka")["/var/lib/kafka/data"] / "meta.properties").is_file()
    print(f"[compose] {len(stack.services)} services started: {time.monotonic() - t0:.1f} s")

    # the log as a client on the host reads it: through Kafka's EXTERNAL listener
    host_env = tr.env("agent")
    cfg = KafkaConfig(bootstrap=host_env["TRAINGUARD_KAFKA_BOOTSTRAP"],
                      topic_prefix=host_env["TRAINGUARD_KAFKA_TOPIC_PREFIX"],
                      client_id="compose-test")
    spec_file = tr.mounts("actuator")["/etc/trainguard/job.yaml"]
    job = load_job_spec(spec_file)
    tail = LogTail(cfg, job.job_id)
    tail.start()
    try:
        _wait(lambda: view(tail.events()).checkpoints >= 2
              and len(view(tail.events()).steps_at_epoch) == job.world_size, 60,
              f"the compose job {job.job_id}: every rank stepping, 2 checkpoints", stack,
              failed=lambda: _exited(_bound_pids(tail.events())))

        # The compose Prometheus (deploy/prometheus/prometheus.yml, its addresses as the
        # prometheus container resolves them) has every trainguard target up. Here every
        # address is this host, so a service bound to 127.0.0.1 would be up too: each must
        # listen on every interface, or Prometheus's container could not reach it.
        api = f"http://{tr.address('prometheus', 'localhost:9090')}/api/v1/targets"
        _wait(lambda: _trainguard_targets(api) == {"up"}, 60,
              f"every trainguard target up in Prometheus ({api})", stack)
        for name in ("agent", "metrics", "decide", "actuator", "alerts"):
            proc = stack.services[name].proc
            assert proc is not None
            binds = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(proc.pid)
                     .net_connections("tcp") if c.status == psutil.CONN_LISTEN}
            assert any(ip == "0.0.0.0" for ip, _ in binds), (name, binds)

        print(f"[compose] job stepping: {time.monotonic() - t0:.1f} s")
        base = view(tail.events()).epoch
        victim = _bound_pids(tail.events())[job.world_size - 1]
        killed_at = time.time_ns() // 1000
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: any(s is IncidentState.RECOVERED
                          for s in _incidents(tail.events(), killed_at - 5_000_000).values()),
              60, f"the incident of rank {job.world_size - 1}'s kill to end recovered", stack)
        print(f"[compose] recovered: {time.monotonic() - t0:.1f} s")
        # the alerts service posted the incident to the compose Alertmanager
        alerts_metrics = f"http://{tr.address('prometheus', 'alerts:9405')}/metrics"
        _wait(lambda: _sent_to_alertmanager(alerts_metrics) > 0, 30,
              "the alerts service to post to Alertmanager", stack)
        v = view(tail.events(), base_epoch=base)
        assert v.epochs_after >= 1
        # the alerts' timeline link, as a browser on the host follows it (the published port
        # of the incidents service), serves that incident's page live from the incident state
        conf = next(str(v).split(":")[0] for v in services["alerts"]["volumes"]
                    if str(v).split(":")[1] == "/etc/trainguard/alerts.yml")
        links = yaml.safe_load((ROOT / conf).read_text())  # as written, not as translated
        timeline = tr.address("agent", links["links"]["timeline_url"]).rstrip("/")
        recovered = [i for i, s in _incidents(tail.events(), killed_at - 5_000_000).items()
                     if s is IncidentState.RECOVERED]
        page = _wait_page(f"{timeline}/incidents/{recovered[0]}", stack)
        assert recovered[0] in page and "recovered" in page.lower(), page[:400]
    finally:
        done = stack.end_job()  # no fault of the job's own: no incident left open
        tail.stop()
    print(f"[compose] torn down: {time.monotonic() - t0:.1f} s")
    assert done is not None and done.returncode == 0, done
    incidents = _incidents(tail.events(), 0)
    assert incidents and all(s in ENDS for s in incidents.values()), incidents
    spec = yaml.safe_load(spec_file.read_text())
    assert str(tr.root) in spec["ckpt_dir"]
