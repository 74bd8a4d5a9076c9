"""Every channel's request for a fixed message at a fixed time: body, URL, signature.

The signature vectors were computed independently with openssl:
  printf '' | openssl dgst -sha256 -mac HMAC -macopt "key:$(printf '1599360473\\ndemo-secret')" \\
      -binary | base64
  printf '1599360473000\\nSECdemo' | openssl dgst -sha256 -hmac SECdemo -binary | base64
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import urllib.parse
from typing import Any

from trainguard.alerts.channels.alertmanager import AlertmanagerChannel
from trainguard.alerts.channels.dingtalk import DingTalkChannel
from trainguard.alerts.channels.feishu import FeishuChannel
from trainguard.alerts.channels.slack import SlackChannel
from trainguard.alerts.channels.webhook import WebhookChannel
from trainguard.alerts.channels.wecom import WeComChannel
from trainguard.alerts.model import Notice, NoticeKind
from trainguard.alerts.render import Message, group, truncate_utf8
from trainguard.alerts.reply import Verdict, judge
from trainguard.alerts.secrets import Secret
from trainguard.alerts.signing import dingtalk_sign, feishu_sign, webhook_sign
from trainguard.events.payloads import IncidentState as S

T0 = 1_790_000_000_000_000
NOW_S = 1599360473.25


def notice(kind: NoticeKind = NoticeKind.OPENED, inc: str = "a1b2c3d4e5f6a7b8c9d0",
           state: S = S.LOCATED) -> Notice:
    return Notice(kind=kind, incident_id=inc, job_id="job-demo", state=state, opened_at_us=T0,
                  at_us=T0 + 42_000_000, transitions=3, reason="rank 3 exited (signal 9)",
                  tier=1, node="node-a", rank=3)


ONE = Message((notice(),))


def body(raw: bytes) -> Any:
    return json.loads(raw)


def test_signatures_match_independent_vectors() -> None:
    assert feishu_sign(1599360473, "demo-secret") == (
        "3/MaVZ8JLIy4TUG+7KSFJqvUkTKd+HWY8g+56DZWq8s=")
    assert dingtalk_sign(1599360473000, "SECdemo") == (
        "tGWkA5eQOQNCNPDgphtxIoNLO+/gD8Lcb705KQoRzeY=")
    assert webhook_sign(1599360473, b"{}", "whsec") == (
        "sha256=b35b3301028faabe990d5b81168407ca51f003945275ee997902d4171a991611")


def test_slack_is_mrkdwn_text_with_the_incident_title_and_thread_key() -> None:
    req = SlackChannel("s", Secret("https://hooks.slack.com/services/T1/B2/tokentokentokentoken")
                       ).build(ONE, NOW_S)
    doc = body(req.body)
    assert doc["text"].startswith("*[FAULT] trainguard · job-demo · INC-a1b2c3d4e5f6*\n")
    assert "where: node node-a, rank 3" in doc["text"]
    assert "thread: trainguard/job-demo/a1b2c3d4e5f6a7b8c9d0" in doc["text"]
    assert req.url.endswith("/tokentokentokentoken")
    assert "token" not in req.shown
    assert judge(200, b"ok", {}, req.check).verdict == Verdict.DELIVERED
    assert judge(200, b"invalid_payload", {}, req.check).verdict == Verdict.REFUSED
    limited = judge(429, b"rate_limited", {"Retry-After": "3"}, req.check)
    assert (limited.verdict, limited.retry_after_s) == (Verdict.RETRY, 3.0)


def test_feishu_post_signed_in_the_body() -> None:
    ch = FeishuChannel("f", Secret("https://open.feishu.cn/open-apis/bot/v2/hook/uuid-1"),
                       Secret("demo-secret"))
    doc = body(ch.build(ONE, NOW_S).body)
    assert doc["timestamp"] == "1599360473"
    assert doc["sign"] == "3/MaVZ8JLIy4TUG+7KSFJqvUkTKd+HWY8g+56DZWq8s="
    assert doc["msg_type"] == "post"
    post = doc["content"]["post"]["zh_cn"]
    assert post["title"] == "[FAULT] trainguard · job-demo · INC-a1b2c3d4e5f6"
    assert {"tag": "text", "text": "state: located (tier 1)"} in [c[0] for c in post["content"]]
    unsigned = body(FeishuChannel("f", Secret("https://x/hook/u")).build(ONE, NOW_S).body)
    assert "sign" not in unsigned and "timestamp" not in unsigned
    check = ch.build(ONE, NOW_S).check
    assert judge(200, b'{"code":0,"msg":"success"}', {}, check).verdict == Verdict.DELIVERED
    assert judge(200, b'{"StatusCode":0}', {}, check).verdict == Verdict.DELIVERED
    assert judge(200, b'{"code":19021,"msg":"sign match fail"}', {},
                 check).verdict == Verdict.REFUSED
    assert judge(200, b'{"code":9499,"msg":"too many"}', {}, check).verdict == Verdict.RETRY


def test_dingtalk_signed_in_the_query_as_the_docs_python_sample_does() -> None:
    ch = DingTalkChannel("d", Secret("https://oapi.dingtalk.com/robot/send?access_token=abc123"),
                         Secret("SECdemo"))
    req = ch.build(ONE, NOW_S)
    query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(req.url).query))
    assert query == {"access_token": "abc123", "timestamp": "1599360473250",
                     "sign": dingtalk_sign(1599360473250, "SECdemo")}
    # the docs' sample: quote_plus(base64(hmac(secret, f"{ts}\n{secret}")))
    mac = hmac.new(b"SECdemo", b"1599360473250\nSECdemo", hashlib.sha256).digest()
    assert "sign=" + urllib.parse.quote_plus(base64.b64encode(mac)) in req.url
    doc = body(req.body)
    assert doc["msgtype"] == "markdown"
    assert doc["markdown"]["title"].startswith("[FAULT]")
    assert doc["markdown"]["text"].startswith("**[FAULT] trainguard")
    text = DingTalkChannel("d", Secret("https://x/send?access_token=t"), msgtype="text")
    assert body(text.build(ONE, NOW_S).body)["text"]["content"].startswith("[FAULT]")
    assert judge(200, b'{"errcode":130101,"errmsg":"send too fast"}', {},
                 req.check).verdict == Verdict.RETRY
    assert judge(200, b'{"errcode":310000,"errmsg":"sign not match"}', {},
                 req.check).verdict == Verdict.REFUSED


def test_wecom_markdown_and_text_within_their_byte_limits() -> None:
    url = Secret("https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=693a91f6-7xxx")
    many = Message(tuple(notice(inc=f"incident-{i:04d}-" + "x" * 40) for i in range(200)))
    md = body(WeComChannel("w", url).build(many, NOW_S).body)
    assert md["msgtype"] == "markdown"
    assert len(md["markdown"]["content"].encode()) <= 4096
    assert "... and 180 more" in md["markdown"]["content"]
    text = body(WeComChannel("w", url, msgtype="text").build(ONE, NOW_S).body)
    assert text["msgtype"] == "text" and len(text["text"]["content"].encode()) <= 2048
    assert judge(200, b'{"errcode":45009}', {}, WeComChannel("w", url).build(ONE, 0).check
                 ).verdict == Verdict.RETRY


def test_generic_webhook_carries_data_and_an_hmac_over_timestamp_and_body() -> None:
    req = WebhookChannel("h", Secret("http://127.0.0.1:1/hook"), Secret("whsec")).build(
        ONE, NOW_S)
    assert req.headers["X-Trainguard-Timestamp"] == "1599360473"
    want = hmac.new(b"whsec", b"1599360473." + req.body, hashlib.sha256).hexdigest()
    assert req.headers["X-Trainguard-Signature"] == "sha256=" + want
    doc = body(req.body)
    assert doc["digest"] is False
    [n] = doc["notices"]
    assert n["kind"] == "opened" and n["incident_id"] == "a1b2c3d4e5f6a7b8c9d0"
    assert n["thread_key"] == "trainguard/job-demo/a1b2c3d4e5f6a7b8c9d0"
    assert n["opened_at"] == "2026-09-21T14:13:20.000000Z"


def test_alertmanager_firing_then_resolved_with_stable_labels() -> None:
    ch = AlertmanagerChannel("am", "http://127.0.0.1:9093/", resend_s=60)
    req = ch.build(ONE, now_s=T0 / 1e6 + 100)
    assert req.url == "http://127.0.0.1:9093/api/v2/alerts"
    [firing] = body(req.body)
    labels = {"alertname": "TrainguardIncident", "incident_id": "a1b2c3d4e5f6a7b8c9d0",
              "job_id": "job-demo", "source": "trainguard"}
    assert firing["labels"] == labels
    assert firing["startsAt"] == "2026-09-21T14:13:20.000000Z"
    assert firing["endsAt"] == "2026-09-21T14:19:00.000000Z"  # now + 4 x resend_s
    assert firing["annotations"]["state"] == "located"
    done = Message((notice(NoticeKind.RECOVERED, state=S.RECOVERED),))
    [resolved] = body(ch.build(done, now_s=T0 / 1e6 + 100).body)
    assert resolved["labels"] == labels
    assert resolved["endsAt"] == "2026-09-21T14:14:02.000000Z"  # the recovery's event time
    both = Message((notice(), notice(NoticeKind.RECOVERED, state=S.RECOVERED)))
    assert [a["annotations"]["notice"] for a in body(ch.build(both, 0).body)] == ["recovered"]


def test_grouping_individual_up_to_the_limit_then_one_digest() -> None:
    ns = [notice(inc=f"i{i}") for i in range(6)]
    assert [len(m.notices) for m in group(ns[:5], 5)] == [1] * 5
    [digest] = group(ns, 5)
    assert digest.digest and digest.title.startswith("[DIGEST] trainguard · 6 incidents: 6 opened")
    assert [len(m.notices) for m in group(ns, 0)] == [6]
    assert group([], 5) == []


def test_truncation_keeps_valid_utf8() -> None:
    s = "é" * 100
    cut = truncate_utf8(s, 51)
    assert len(cut.encode()) <= 51 and cut.endswith(" ...")
    assert truncate_utf8("short", 10) == "short"
