"""Through a real Alertmanager: `trainguard alerts run` (the CLI, as a process) posts to
Debian's prometheus-alertmanager started here, which routes to the local receiver: firing
while the incident is open, resolved once it recovers. The service's /metrics count both."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import arun
from tests.integration.test_alerts_chat import closing, opening
from trainguard.bus.config import KafkaConfig
from trainguard.bus.producer import EventProducer
from trainguard.dev.alertmanager import AlertmanagerError, LocalAlertmanager, webhook_config
from trainguard.dev.kafka import free_port
from trainguard.dev.webhook_receiver import Received, Route, WebhookReceiver
from trainguard.events.envelope import Event
from trainguard.events.payloads import IncidentState as S


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver([Route("am", "/am/")]) as rx:
        yield rx


@pytest.fixture
def alertmanager(tmp_path: Path, receiver: WebhookReceiver) -> Iterator[LocalAlertmanager]:
    am = LocalAlertmanager(tmp_path / "am")
    try:
        am.start(webhook_config(receiver.url("/am/"), group_wait="1s", group_interval="1s"))
    except AlertmanagerError as err:  # missing or broken: a failure, never a skip
        pytest.fail(f"the real Alertmanager could not start: {err}", pytrace=False)
    yield am
    am.stop()


def notifications(rx: WebhookReceiver, inc: str) -> list[tuple[str, str]]:
    """(group status, this incident's alert status) per webhook call from Alertmanager."""
    out = []
    for r in rx.records("am"):
        doc: dict[str, Any] = r.json()
        for alert in doc["alerts"]:
            if alert["labels"].get("incident_id") == inc:
                out.append((doc["status"], alert["status"]))
    return out


def publish(kafka: KafkaConfig, events: list[Event]) -> None:
    async def go() -> None:
        async with EventProducer(kafka) as producer:
            for ev in events:
                await producer.send(ev)
    arun(go())


def wait(rx: WebhookReceiver, inc: str, status: str, proc: subprocess.Popen[bytes],
         timeout_s: float) -> None:
    def done(_: list[Received]) -> bool:
        return (status, status) in notifications(rx, inc) or proc.poll() is not None
    rx.wait_for(done, timeout_s)
    assert proc.poll() is None, f"the alerts service exited: {proc.returncode}"
    assert (status, status) in notifications(rx, inc), (
        f"no {status} notification for {inc}: {notifications(rx, inc)}")


def metric(port: int, name: str, labels: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if (line.startswith((f"{name}{{", f"{name} "))
                and all(part in line for part in labels.split(","))):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_alertmanager_fires_then_resolves_the_incident(
        kafka: KafkaConfig, receiver: WebhookReceiver, alertmanager: LocalAlertmanager,
        tmp_path: Path) -> None:
    assert alertmanager.info is not None
    config = tmp_path / "alerts.yaml"
    config.write_text("coalesce: {hold_s: 0.3}\nchannels:\n"
                      f"  - {{name: am, type: alertmanager, url: '{alertmanager.info.url}', "
                      "resend_s: 1}\n")
    port = free_port()
    inc = f"am{uuid.uuid4().hex[:8]}"
    log = tmp_path / "alerts.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainguard.cli.main", "alerts", "run", "--config",
             str(config), "--bootstrap", kafka.bootstrap, "--prefix", kafka.topic_prefix,
             "--from-offset", "earliest", "--metrics-port", str(port)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        publish(kafka, opening("job-am", inc))
        wait(receiver, inc, "firing", proc, 40)
        assert notifications(receiver, inc)[0] == ("firing", "firing")
        # re-sent while firing: Alertmanager keeps one alert and notifies once
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and metric(
                port, "trainguard_alerts_messages_sent_total", 'channel="am",kind="refresh"') < 2:
            time.sleep(0.3)
        assert metric(port, "trainguard_alerts_messages_sent_total",
                      'channel="am",kind="refresh"') >= 2
        assert notifications(receiver, inc) == [("firing", "firing")]
        publish(kafka, closing("job-am", inc, S.RECOVERED))
        wait(receiver, inc, "resolved", proc, 30)
        statuses = [s for s, _ in notifications(receiver, inc)]
        assert statuses.index("resolved") > statuses.index("firing")
        sent = 'channel="am"'
        assert metric(port, "trainguard_alerts_messages_sent_total", f'{sent},kind="opened"') == 1
        assert metric(port, "trainguard_alerts_messages_sent_total",
                      f'{sent},kind="recovered"') == 1
        assert metric(port, "trainguard_alerts_transitions_total", "") == 5
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    assert rc == 0, log.read_text()[-3000:]


def test_the_deployed_alertmanager_config_is_valid_and_groups_per_incident() -> None:
    import shutil

    import yaml

    root = Path(__file__).resolve().parents[2]
    path = root / "deploy" / "alertmanager" / "alertmanager.yml"
    amtool = shutil.which("amtool")
    assert amtool, "amtool (Debian's prometheus-alertmanager) is missing"
    check = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True,
                           timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    doc = yaml.safe_load(path.read_text())
    assert "incident_id" in doc["route"]["group_by"]


ROUTED = """route:
  receiver: ticket
  group_by: [job_id, incident_id]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
  routes:
    - receiver: page
      matchers: ['severity="critical"']
receivers:
  - name: page
    webhook_configs: [{url: "PAGE_URL", send_resolved: true, max_alerts: 0}]
  - name: ticket
    webhook_configs: [{url: "TICKET_URL", send_resolved: true, max_alerts: 0}]
"""


def test_routes_by_severity_with_links_through_the_real_alertmanager(tmp_path: Path) -> None:
    """Our alerts, as built from a config with links, posted to the real Alertmanager routing
    by severity to two local receivers: the critical incident pages, the warning one goes to
    the ticket queue, and each arrives with its labels, generatorURL and Grafana link."""
    from trainguard.alerts.config import load
    from trainguard.alerts.http import AiohttpPoster, Reply
    from trainguard.alerts.model import Notice, NoticeKind
    from trainguard.alerts.render import Message
    from trainguard.events.clock import now_us
    from trainguard.events.payloads import Severity, VerdictKind

    with WebhookReceiver([Route("page", "/page/"), Route("ticket", "/ticket/")]) as rx, \
            LocalAlertmanager(tmp_path / "am") as am:
        try:
            info = am.start(ROUTED.replace("PAGE_URL", rx.url("/page/"))
                            .replace("TICKET_URL", rx.url("/ticket/")))
        except AlertmanagerError as err:
            pytest.fail(f"the real Alertmanager could not start: {err}", pytrace=False)
        config = tmp_path / "alerts.yaml"
        config.write_text("links: {grafana_url: 'http://grafana.test:3000', "
                          "timeline_url: 'http://127.0.0.1:8470'}\nchannels:\n"
                          f"  - {{name: am, type: alertmanager, url: '{info.url}'}}\n")
        [built] = load(config, {}).channels
        t0 = now_us()
        incidents = {"c" * 32: (Severity.CRITICAL, VerdictKind.PROCESS_EXIT, "node-a", 3),
                     "d" * 32: (Severity.WARNING, VerdictKind.STRAGGLER, "node-b", 5)}
        notices = tuple(
            Notice(kind=NoticeKind.OPENED, incident_id=inc, job_id="job-route",
                   state=S.LOCATED, opened_at_us=t0, at_us=t0, transitions=2,
                   node=node, rank=rank, severity=sev, verdict_kind=kind, first_node=node,
                   first_rank=rank)
            for inc, (sev, kind, node, rank) in incidents.items())

        async def post() -> None:
            poster = AiohttpPoster()
            try:
                reply = await poster.post(built.channel.build(Message(notices), time.time()),
                                          10)
            finally:
                await poster.close()
            assert isinstance(reply, Reply) and reply.status == 200, reply
        arun(post())

        def got(route: str) -> dict[str, dict[str, Any]]:
            return {a["labels"]["incident_id"]: a for r in rx.records(route)
                    for a in r.json()["alerts"]}
        rx.wait_for(lambda _: bool(got("page")) and bool(got("ticket")), 30)
        page, ticket = got("page"), got("ticket")
    assert set(page) == {"c" * 32} and set(ticket) == {"d" * 32}
    alert = page["c" * 32]
    assert {k: alert["labels"][k] for k in ("severity", "verdict_kind", "job_id", "node",
                                            "rank")} == {
        "severity": "critical", "verdict_kind": "process_exit", "job_id": "job-route",
        "node": "node-a", "rank": "3"}
    assert alert["generatorURL"] == f"http://127.0.0.1:8470/incidents/{'c' * 32}"
    assert alert["annotations"]["grafana_url"].startswith(
        "http://grafana.test:3000/d/tg-job?from=")
    assert "var-node=node-b&var-rank=5" in ticket["d" * 32]["annotations"]["grafana_url"]
    assert ticket["d" * 32]["labels"]["severity"] == "warning"


def test_the_deployed_alertmanager_config_routes_by_severity() -> None:
    """amtool, on deploy/alertmanager/alertmanager.yml: which receiver each severity reaches."""
    import shutil

    root = Path(__file__).resolve().parents[2]
    path = root / "deploy" / "alertmanager" / "alertmanager.yml"
    amtool = shutil.which("amtool")
    assert amtool, "amtool (Debian's prometheus-alertmanager) is missing"

    def receiver(*labels: str) -> str:
        out = subprocess.run([amtool, "config", "routes", "test", f"--config.file={path}",
                              *labels], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout.strip()

    base = ("alertname=TrainguardIncident", "source=trainguard", "job_id=j", "incident_id=i")
    assert receiver(*base, "severity=critical") == "trainguard-page"
    assert receiver(*base, "severity=warning") == "trainguard-ticket"
    assert receiver(*base, "severity=info") == "trainguard-oncall"
