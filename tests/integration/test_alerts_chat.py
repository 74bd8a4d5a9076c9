"""Alerts end to end: incident transitions on the real Kafka -> `trainguard alerts` -> a local
HTTP receiver playing every chat vendor (real sockets on 127.0.0.1, signatures checked the
way the vendors check them)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import arun
from trainguard.alerts.config import load
from trainguard.alerts.secrets import RedactingFilter, install_redaction
from trainguard.alerts.service import AlertsService, ServiceOptions
from trainguard.bus.config import KafkaConfig
from trainguard.bus.kafka import KafkaBus
from trainguard.bus.producer import EventProducer
from trainguard.dev.webhook_receiver import (
    Received,
    Route,
    WebhookReceiver,
    dingtalk_check,
    feishu_check,
    hmac_check,
    path_token_check,
    query_token_check,
)
from trainguard.events.clock import now_us
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.ids import derived_id
from trainguard.events.payloads import IncidentState as S
from trainguard.events.payloads import IncidentTransition

SLACK_TOKEN = "slackTOKEN0123456789abcd"
FEISHU_SECRET = "feishu-SECRET-4242"
FEISHU_HOOK = "feishuHOOK-0b1c2d3e4f5a6b7c"
DING_TOKEN = "dingTOKEN-9f8e7d6c5b4a39281"
DING_SECRET = "SECding-0123456789"
WECOM_KEY = "wecomKEY-693a91f6-7aoc-4bc4"
HOOK_SECRET = "hook-SECRET-31337"
BROKEN_TOKEN = "brokenTOKEN-00000000000001"
ALL_SECRETS = (SLACK_TOKEN, FEISHU_SECRET, FEISHU_HOOK, DING_TOKEN, DING_SECRET, WECOM_KEY,
               HOOK_SECRET, BROKEN_TOKEN)
CHAT = ("slack", "feishu", "dingtalk", "wecom", "webhook")
TITLE = re.compile(r"\[(FAULT|RECOVERED|ESCALATED|UNRECOVERABLE|DIGEST)\] trainguard · "
                   r"(\S+) · (INC-\S+)")


def transition(job: str, inc: str, seq: int, frm: S | None, to: S, *, tier: int | None = None,
               t_us: int | None = None) -> Event:
    payload = IncidentTransition(incident_id=inc, seq=seq, from_state=frm, to_state=to,
                                 reason=f"test {to.value}", tier=tier)
    return make_event(payload, event_id=derived_id("test-it", inc, seq), job_id=job,
                      event_time=t_us or now_us(), source="test",
                      subject=Subject(node="node-a", rank=3))


def opening(job: str, inc: str) -> list[Event]:
    return [transition(job, inc, 0, None, S.DETECTED),
            transition(job, inc, 1, S.DETECTED, S.LOCATED),
            transition(job, inc, 2, S.LOCATED, S.MITIGATING, tier=1)]


def closing(job: str, inc: str, end: S) -> list[Event]:
    return [transition(job, inc, 3, S.MITIGATING, S.MITIGATING, tier=2),
            transition(job, inc, 4, S.MITIGATING, end)]


def title_of(r: Received) -> str:
    doc = r.json()
    if r.route == "slack":
        return str(doc["text"]).split("\n", 1)[0].strip("*")
    if r.route == "feishu":
        return str(doc["content"]["post"]["zh_cn"]["title"])
    if r.route == "dingtalk":
        return str(doc["markdown"]["title"])
    if r.route == "wecom":
        return str(doc["markdown"]["content"]).split("\n", 1)[0].strip("*")
    return str(doc["title"])


def seen(rx: WebhookReceiver, route: str) -> Counter[tuple[str, str]]:
    """(mark, ref) per message on a route: ('FAULT', 'INC-...')."""
    out: Counter[tuple[str, str]] = Counter()
    for r in rx.records(route):
        m = TITLE.match(title_of(r))
        assert m is not None, f"{route}: unexpected title {title_of(r)!r}"
        out[(m.group(1), m.group(3))] += 1
    return out


def routes() -> list[Route]:
    return [
        Route("slack", "/slack/", check=path_token_check(SLACK_TOKEN), reply=b"ok"),
        Route("feishu", "/feishu/", check=feishu_check(FEISHU_SECRET)),
        Route("dingtalk", "/dingtalk/", check=dingtalk_check(DING_SECRET, DING_TOKEN)),
        Route("wecom", "/wecom/", check=query_token_check("key", WECOM_KEY)),
        Route("webhook", "/hook/", check=hmac_check(HOOK_SECRET)),
        Route("broken", "/broken/", status=500),
    ]


def write_config(tmp_path: Path, rx: WebhookReceiver, monkeypatch: pytest.MonkeyPatch,
                 channels: tuple[str, ...] = (*CHAT, "broken"), hold_s: float = 0.5) -> Path:
    monkeypatch.setenv("TG_SLACK_URL", rx.url(f"/slack/services/T0/B0/{SLACK_TOKEN}"))
    (tmp_path / "feishu_url").write_text(rx.url(f"/feishu/open-apis/bot/v2/hook/{FEISHU_HOOK}"))
    monkeypatch.setenv("TG_FEISHU_SECRET", FEISHU_SECRET)
    monkeypatch.setenv("TG_DING_URL", rx.url(f"/dingtalk/robot/send?access_token={DING_TOKEN}"))
    (tmp_path / "ding_secret").write_text(DING_SECRET + "\n")
    monkeypatch.setenv("TG_WECOM_URL", rx.url(f"/wecom/cgi-bin/webhook/send?key={WECOM_KEY}"))
    monkeypatch.setenv("TG_HOOK_SECRET", HOOK_SECRET)
    monkeypatch.setenv("TG_BROKEN_URL", rx.url(f"/broken/{BROKEN_TOKEN}"))
    lines = {
        "slack": "{name: slack, type: slack, url: {env: TG_SLACK_URL}}",
        "feishu": f"{{name: feishu, type: feishu, url: {{file: {tmp_path / 'feishu_url'}}}, "
                  "secret: {env: TG_FEISHU_SECRET}}",
        "dingtalk": "{name: dingtalk, type: dingtalk, url: {env: TG_DING_URL}, "
                    f"secret: {{file: {tmp_path / 'ding_secret'}}}}}",
        "wecom": "{name: wecom, type: wecom, url: {env: TG_WECOM_URL}}",
        "webhook": f"{{name: webhook, type: webhook, url: '{rx.url('/hook/x')}', "
                   "secret: {env: TG_HOOK_SECRET}}",
        "broken": "{name: broken, type: webhook, url: {env: TG_BROKEN_URL}, "
                  "retry: {max_attempts: 2, base_s: 0.05, cap_s: 0.1}}",
    }
    path = tmp_path / "alerts.yaml"
    path.write_text(f"coalesce: {{hold_s: {hold_s}}}\nchannels:\n"
                    + "".join(f"  - {lines[c]}\n" for c in channels))
    return path


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    with WebhookReceiver(routes()) as rx:
        yield rx


@pytest.fixture
def scrubbed_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG, logger="trainguard.alerts")
    yield caplog
    for h in logging.getLogger().handlers:
        for f in [f for f in h.filters if isinstance(f, RedactingFilter)]:
            h.removeFilter(f)


async def until(rx: WebhookReceiver, done: Callable[[list[Received]], bool],
                timeout_s: float) -> bool:
    return await asyncio.to_thread(rx.wait_for, done, timeout_s)


def test_every_channel_gets_one_opening_and_one_closing_message_per_incident(
        kafka: KafkaConfig, receiver: WebhookReceiver, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, scrubbed_logs: pytest.LogCaptureFixture) -> None:
    rx = receiver
    config = load(write_config(tmp_path, rx, monkeypatch))
    install_redaction(config.redactor)
    service = AlertsService(config, KafkaBus(kafka), ServiceOptions(
        group_id=f"{kafka.topic_prefix}-alerts", from_offset="earliest"))
    tag = uuid.uuid4().hex[:4]
    incs = {f"a{tag}-1": S.RECOVERED, f"a{tag}-2": S.RECOVERED, f"a{tag}-3": S.ESCALATED}
    refs = {f"INC-{i}" for i in incs}

    def per_channel(mark: str) -> Callable[[list[Received]], bool]:
        def done(_: list[Received]) -> bool:
            return all(sum(n for (m, _r), n in seen(rx, c).items() if m == mark) >= 3
                       for c in CHAT)
        return done

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        async with EventProducer(kafka) as producer:
            for inc in incs:
                for ev in opening("job-alerts", inc):
                    await producer.send(ev)
            assert await until(rx, per_channel("FAULT"), 30), "openings did not all arrive"
            for inc, end in incs.items():
                for ev in closing("job-alerts", inc, end):
                    await producer.send(ev)
            assert await until(rx, lambda _: all(len(rx.records(c)) >= 6 for c in CHAT), 30)
        await asyncio.sleep(1.0)  # anything extra would arrive now
        stop.set()
        await asyncio.wait_for(task, 20)

    arun(scenario(), timeout_s=55)
    expected = Counter({("FAULT", r): 1 for r in refs})
    for inc, end in incs.items():
        expected[({S.RECOVERED: "RECOVERED", S.ESCALATED: "ESCALATED"}[end], f"INC-{inc}")] = 1
    for channel in CHAT:
        assert seen(rx, channel) == expected, channel
        bad = [(r.path, r.problem) for r in rx.records(channel) if r.verified is not True]
        assert bad == [], f"{channel}: requests the vendor would refuse: {bad}"
    # the opening says where and how far it got; the structured webhook carries the thread key
    hook = [n for r in rx.records("webhook") for n in r.json()["notices"]]
    assert {n["thread_key"] for n in hook} == {f"trainguard/job-alerts/{i}" for i in incs}
    assert all(n["node"] == "node-a" and n["rank"] == 3 for n in hook)
    # Slack: one message per second per webhook
    times = sorted(r.received_at for r in rx.records("slack"))
    # (send starts are >= 1 s apart; arrival times can bunch a little on a loaded machine)
    assert all(b - a >= 0.5 for a, b in itertools.pairwise(times)), times
    # the broken channel failed every message and harmed nobody; no secret reached a log
    m = service.metrics
    assert sum(m.failed.labels("broken", k)._value.get()
               for k in ("opened", "recovered", "escalated")) == 6
    assert len(rx.records("broken")) == 12  # two attempts each
    assert m.sent.labels("slack", "opened")._value.get() == 3
    assert "broken gave up" in scrubbed_logs.text
    for secret in ALL_SECRETS:
        assert secret not in scrubbed_logs.text


def test_a_storm_of_transitions_is_a_handful_of_messages(
        kafka: KafkaConfig, receiver: WebhookReceiver, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    rx = receiver
    config = load(write_config(tmp_path, rx, monkeypatch, channels=("slack", "webhook"),
                               hold_s=1.0))
    service = AlertsService(config, KafkaBus(kafka), ServiceOptions(
        group_id=f"{kafka.topic_prefix}-storm", from_offset="earliest"))
    tag = uuid.uuid4().hex[:4]
    incs = [f"s{tag}-{i:03d}" for i in range(150)]

    def all_closed(_: list[Received]) -> bool:
        kinds = Counter((n["kind"], n["incident_id"])
                        for r in rx.records("webhook") for n in r.json()["notices"])
        return sum(1 for k, _i in kinds if k == "recovered") >= len(incs)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        async with EventProducer(kafka) as producer:
            futures = [await producer.enqueue(ev) for inc in incs
                       for ev in [*opening("job-storm", inc), *closing("job-storm", inc,
                                                                      S.RECOVERED)]]
            await asyncio.gather(*futures)
        assert await until(rx, all_closed, 40), "the storm's recoveries did not all arrive"
        await asyncio.sleep(2.0)
        stop.set()
        await asyncio.wait_for(task, 20)

    arun(scenario(), timeout_s=58)
    notices = Counter((n["kind"], n["incident_id"])
                      for r in rx.records("webhook") for n in r.json()["notices"])
    assert notices == Counter({(k, i): 1 for i in incs for k in ("opened", "recovered")})
    assert service.coalescer.stats.transitions == 750
    for channel in ("webhook", "slack"):
        count = len(rx.records(channel))
        assert 1 <= count <= 8, f"{channel}: {count} messages for 750 transitions"
    assert all(title_of(r).startswith("[DIGEST]") for r in rx.records("slack"))


def test_a_restart_neither_repeats_nor_loses_messages(
        kafka: KafkaConfig, receiver: WebhookReceiver, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped after the opening went out, the recovery published while it is down: the next
    start (same group, and 'latest' for a new group) sends the recovery and nothing else."""
    rx = receiver
    config = load(write_config(tmp_path, rx, monkeypatch, channels=("webhook",), hold_s=0.2))
    group = f"{kafka.topic_prefix}-restart"
    inc = f"r{uuid.uuid4().hex[:6]}"

    def kinds() -> list[str]:
        return [n["kind"] for r in rx.records("webhook") for n in r.json()["notices"]
                if n["incident_id"] == inc]

    async def run_until(service: AlertsService, done: Callable[[], bool]) -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop))
        assert await until(rx, lambda _: done(), 25), kinds()
        await asyncio.sleep(1.5)  # past one commit interval
        stop.set()
        await asyncio.wait_for(task, 20)

    async def scenario() -> None:
        async with EventProducer(kafka) as producer:
            for ev in opening("job-restart", inc):
                await producer.send(ev)
            first = AlertsService(config, KafkaBus(kafka),
                                  ServiceOptions(group, from_offset="earliest"))
            await run_until(first, lambda: kinds() == ["opened"])
            for ev in closing("job-restart", inc, S.RECOVERED):
                await producer.send(ev)
        second = AlertsService(config, KafkaBus(kafka), ServiceOptions(group, from_offset="latest"))
        await run_until(second, lambda: "recovered" in kinds())

    arun(scenario(), timeout_s=58)
    assert kinds() == ["opened", "recovered"]
