"""The receiver's vendor checks accept what the channels send and refuse what a vendor would
refuse (wrong secret, stale timestamp, wrong token): the integration tests rely on them."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import yaml

from trainguard.alerts.channels.base import HttpRequest
from trainguard.alerts.channels.dingtalk import DingTalkChannel
from trainguard.alerts.channels.feishu import FeishuChannel
from trainguard.alerts.channels.slack import SlackChannel
from trainguard.alerts.channels.webhook import WebhookChannel
from trainguard.alerts.channels.wecom import WeComChannel
from trainguard.alerts.config import parse
from trainguard.alerts.model import Notice, NoticeKind
from trainguard.alerts.render import Message
from trainguard.alerts.secrets import Secret
from trainguard.dev.webhook_receiver import (
    Received,
    dingtalk_check,
    feishu_check,
    hmac_check,
    path_token_check,
    query_token_check,
)
from trainguard.events.payloads import IncidentState

MSG = Message((Notice(kind=NoticeKind.OPENED, incident_id="i1", job_id="j",
                      state=IncidentState.DETECTED, opened_at_us=1, at_us=1, transitions=1),))
ROOT = Path(__file__).resolve().parents[2]


def received(req: HttpRequest) -> Received:
    split = urlsplit(req.url)
    return Received(route="x", path=split.path, query=dict(parse_qsl(split.query)),
                    headers={k.lower(): v for k, v in req.headers.items()}, body=req.body,
                    received_at=time.time())


def test_feishu() -> None:
    ch = FeishuChannel("f", Secret("http://h/hook/u"), Secret("right"))
    assert feishu_check("right")(received(ch.build(MSG, time.time()))) is None
    assert feishu_check("wrong")(received(ch.build(MSG, time.time()))) == "sign mismatch"
    stale = received(ch.build(MSG, time.time() - 7200))
    assert feishu_check("right")(stale) == "timestamp too far from now"
    unsigned = FeishuChannel("f", Secret("http://h/hook/u"))
    assert feishu_check("right")(received(unsigned.build(MSG, time.time()))) is not None


def test_dingtalk() -> None:
    ch = DingTalkChannel("d", Secret("http://h/robot/send?access_token=tok"), Secret("SECx"))
    assert dingtalk_check("SECx", "tok")(received(ch.build(MSG, time.time()))) is None
    assert dingtalk_check("SECy", "tok")(received(ch.build(MSG, time.time()))) == "sign mismatch"
    assert dingtalk_check("SECx", "other")(received(ch.build(MSG, time.time()))) is not None
    stale = received(ch.build(MSG, time.time() - 7200))
    assert dingtalk_check("SECx", "tok")(stale) == "timestamp too far from now"


def test_webhook_hmac_and_tokens() -> None:
    ch = WebhookChannel("h", Secret("http://h/hook"), Secret("k1"))
    req = ch.build(MSG, time.time())
    assert hmac_check("k1")(received(req)) is None
    assert hmac_check("k2")(received(req)) == "bad HMAC"
    tampered = HttpRequest(url=req.url, body=req.body + b" ", shown="", headers=req.headers)
    assert hmac_check("k1")(received(tampered)) == "bad HMAC"
    slack = SlackChannel("s", Secret("http://h/services/T/B/tok123")).build(MSG, 0)
    assert path_token_check("tok123")(received(slack)) is None
    assert path_token_check("tok124")(received(slack)) is not None
    wecom = WeComChannel("w", Secret("http://h/send?key=k-1")).build(MSG, 0)
    assert query_token_check("key", "k-1")(received(wecom)) is None
    assert query_token_check("key", "k-2")(received(wecom)) is not None


def test_the_deployed_alerts_config_is_valid() -> None:
    """The compose copy starts with no secret set; the example shows every channel type."""
    deployed = ROOT / "deploy" / "alertmanager" / "trainguard-alerts.yml"
    assert {c.type for c in parse(yaml.safe_load(deployed.read_text())).channels} == \
        {"alertmanager"}
    example = ROOT / "deploy" / "alertmanager" / "trainguard-alerts.example.yml"
    spec = parse(yaml.safe_load(example.read_text()))
    assert {c.type for c in spec.channels} == {"alertmanager", "slack", "feishu", "dingtalk",
                                               "wecom", "webhook"}
