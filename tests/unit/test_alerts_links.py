"""Links, mentions and Slack Block Kit in the built requests of every channel; the
Alertmanager labels and generatorURL; the config's links and mentions, and its errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.alerts.channels.alertmanager import AlertmanagerChannel
from trainguard.alerts.channels.dingtalk import DingTalkChannel
from trainguard.alerts.channels.feishu import FeishuChannel
from trainguard.alerts.channels.slack import SlackChannel
from trainguard.alerts.channels.webhook import WebhookChannel
from trainguard.alerts.channels.wecom import WeComChannel
from trainguard.alerts.config import ConfigError, load
from trainguard.alerts.links import INCIDENTS_DASHBOARD_UID, JOB_DASHBOARD_UID, Links
from trainguard.alerts.mentions import Mention, Mentions
from trainguard.alerts.model import Notice, NoticeKind
from trainguard.alerts.render import Message
from trainguard.alerts.secrets import Secret
from trainguard.dashboards.build import build_all
from trainguard.events.payloads import IncidentState as S
from trainguard.events.payloads import Severity, VerdictKind
from trainguard.text import escape

T0 = 1_790_000_000_000_000  # µs
NOW_S = T0 / 1e6 + 100
INC = "a1b2c3d4e5f6a7b8c9d0a1b2c3d4e5f6"
LINKS = Links("https://grafana.example.org/", "http://incidents.example.org:8470", pad_s=60)
MENTIONS = Mentions({Severity.CRITICAL: Mention(user_ids=("U01ABC",), group_ids=("S02XYZ",)),
                     Severity.WARNING: Mention(user_ids=("U0WARN",))})
URL = Secret("https://hooks.example.org/hook/token")


def notice(kind: NoticeKind = NoticeKind.OPENED, severity: Severity | None = Severity.CRITICAL,
           node: str = "node-a", inc: str = INC, refresh: bool = False) -> Notice:
    state = S.RECOVERED if kind == NoticeKind.RECOVERED else S.LOCATED
    return Notice(kind=kind, incident_id=inc, job_id="job demo", state=state, opened_at_us=T0,
                  at_us=T0 + 42_000_000, transitions=3, reason="rank 3 exited", tier=1,
                  node=node, rank=3, severity=severity, verdict_kind=VerdictKind.PROCESS_EXIT,
                  first_node="node-a", first_rank=3, refresh=refresh)


ONE = Message((notice(),))
GRAFANA_OPEN = ("https://grafana.example.org/d/tg-job?from=1789999940000&to=1790000160000&"
                "var-job=job+demo&var-node=node-a&var-rank=3")  # opened-60 s .. now+60 s
TIMELINE = f"http://incidents.example.org:8470/incidents/{INC}"


def body(raw: bytes) -> Any:
    return json.loads(raw)


def test_the_linked_dashboard_exists_with_the_variables_the_links_set() -> None:
    docs = {d["uid"]: d for d in build_all().values()}
    assert {"job", "node", "rank"} <= {t["name"] for t in
                                       docs[JOB_DASHBOARD_UID]["templating"]["list"]}
    assert INCIDENTS_DASHBOARD_UID in docs


def test_grafana_range_covers_the_incident_open_until_now_closed_until_its_end() -> None:
    assert LINKS.grafana(notice(), int(NOW_S * 1e6)) == GRAFANA_OPEN
    done = LINKS.grafana(notice(NoticeKind.RECOVERED), int(NOW_S * 1e6))
    assert done is not None
    q = parse_qs(urlsplit(done).query)
    assert (q["from"], q["to"]) == (["1789999940000"], ["1790000102000"])  # at + 60 s
    assert LINKS.timeline(notice()) == TIMELINE
    assert Links().grafana(notice(), 0) is None and Links().timeline(notice()) is None


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30), st.text(max_size=30))
def test_user_text_never_leaves_its_query_value(job: str, node: str) -> None:
    n = Notice(kind=NoticeKind.OPENED, incident_id=INC, job_id=job, state=S.LOCATED,
               opened_at_us=T0, at_us=T0, transitions=1, node=node or None, rank=1)
    url = LINKS.grafana(n, T0)
    assert url is not None
    assert not any(ch in url for ch in " <>|()[]\"'\n")  # safe in Markdown and <url|text>
    q = parse_qs(urlsplit(url).query, keep_blank_values=True)
    assert q["var-job"] == [job] and set(q) <= {"from", "to", "var-job", "var-node", "var-rank"}
    if node:
        assert q["var-node"] == [node]


def test_slack_block_kit_with_link_buttons_and_mentions() -> None:
    doc = body(SlackChannel("s", URL, links=LINKS, mentions=MENTIONS).build(ONE, NOW_S).body)
    kinds = [b["type"] for b in doc["blocks"]]
    assert kinds == ["header", "section", "context", "actions"]
    header, section, context, actions = doc["blocks"]
    assert header["text"] == {"type": "plain_text", "emoji": False,
                              "text": "[FAULT] trainguard · job demo · INC-a1b2c3d4e5f6"}
    assert section["text"]["type"] == "mrkdwn"
    assert section["text"]["text"].startswith("<@U01ABC> <!subteam^S02XYZ>\nstate: located")
    assert context["elements"][0]["text"] == (
        f"severity: critical · verdict: process_exit · thread: trainguard/job demo/{INC}")
    assert [(e["type"], e["text"]["text"], e["url"]) for e in actions["elements"]] == [
        ("button", "Grafana", GRAFANA_OPEN), ("button", "Timeline", TIMELINE)]
    assert doc["text"].startswith("*[FAULT] trainguard · job demo · INC-a1b2c3d4e5f6*\n")
    assert f"<{TIMELINE}|Timeline>" in doc["text"]


def test_mentions_follow_severity_and_only_when_a_human_is_needed() -> None:
    def section(m: Message) -> str:
        doc = body(SlackChannel("s", URL, mentions=MENTIONS).build(m, NOW_S).body)
        return str(doc["blocks"][1]["text"]["text"]).split("\n", 1)[0]

    assert section(Message((notice(severity=Severity.WARNING),))) == "<@U0WARN>"
    assert section(Message((notice(severity=Severity.INFO),))) == "state: located (tier 1)"
    assert section(Message((notice(NoticeKind.RECOVERED),))) == "state: recovered (tier 1)"
    assert section(Message((notice(refresh=True),))) == "state: located (tier 1)"
    assert section(Message((notice(NoticeKind.ESCALATED),))).startswith("<@U01ABC>")
    digest = Message((notice(severity=Severity.WARNING, inc="i1"), notice(inc="i2")))
    assert section(digest).startswith("<@U01ABC> <!subteam^S02XYZ>")  # the most severe


HOSTILE = st.text(st.one_of(st.sampled_from(list("<>&|!@^*_`\n")),
                            st.characters(exclude_categories=["Cs"])), max_size=30)


@settings(max_examples=150, deadline=None)
@given(HOSTILE, HOSTILE)
def test_slack_blocks_keep_user_text_escaped(node: str, reason: str) -> None:
    n = Notice(kind=NoticeKind.OPENED, incident_id=INC, job_id="j", state=S.LOCATED,
               opened_at_us=T0, at_us=T0, transitions=1, node=node or None, rank=1,
               reason=reason, severity=Severity.CRITICAL)
    doc = body(SlackChannel("s", URL, links=LINKS, mentions=MENTIONS).build(
        Message((n,)), NOW_S).body)
    mention = "<@U01ABC> <!subteam^S02XYZ>"
    for block in doc["blocks"][1:3]:
        texts = [block["text"]["text"]] if "text" in block else [
            e["text"] for e in block["elements"]]
        for text in texts:
            rest = text.removeprefix(mention)
            assert "<" not in rest and ">" not in rest  # only the configured mentions
    if node:
        assert f"where: node {escape.slack(node)}" in doc["blocks"][1]["text"]["text"]
    assert doc["blocks"][0]["text"]["type"] == "plain_text"


def test_feishu_links_as_a_tags_and_mentions_as_at_tags() -> None:
    who = Mentions({Severity.CRITICAL: Mention(user_ids=("ou_abc",), all=True)})
    doc = body(FeishuChannel("f", URL, links=LINKS, mentions=who).build(ONE, NOW_S).body)
    content = doc["content"]["post"]["zh_cn"]["content"]
    assert content[-2] == [{"tag": "a", "text": "Grafana ", "href": GRAFANA_OPEN},
                           {"tag": "a", "text": "Timeline ", "href": TIMELINE}]
    assert content[-1] == [{"tag": "at", "user_id": "ou_abc"}, {"tag": "at", "user_id": "all"}]


def test_dingtalk_links_and_at_mobiles_user_ids() -> None:
    who = Mentions({Severity.CRITICAL: Mention(user_ids=("manager42",), mobiles=("13800000000",))})
    doc = body(DingTalkChannel("d", URL, links=LINKS, mentions=who).build(ONE, NOW_S).body)
    assert doc["at"] == {"atMobiles": ["13800000000"], "atUserIds": ["manager42"],
                         "isAtAll": False}
    text = doc["markdown"]["text"]
    assert f"[Grafana]({GRAFANA_OPEN}) · [Timeline]({TIMELINE})" in text
    assert text.endswith("@13800000000 @manager42")
    plain = body(DingTalkChannel("d", URL, msgtype="text", links=LINKS).build(ONE, NOW_S).body)
    assert f"Timeline: {TIMELINE}" in plain["text"]["content"] and "at" not in plain
    quiet = body(DingTalkChannel("d", URL, mentions=who).build(
        Message((notice(NoticeKind.RECOVERED),)), NOW_S).body)
    assert "at" not in quiet


def test_wecom_mentioned_lists_in_text_and_user_mentions_in_markdown() -> None:
    who = Mentions({Severity.CRITICAL: Mention(user_ids=("zhangsan",), mobiles=("13800000000",),
                                               all=True)})
    text = body(WeComChannel("w", URL, msgtype="text", links=LINKS, mentions=who).build(
        ONE, NOW_S).body)["text"]
    assert text["mentioned_list"] == ["zhangsan", "@all"]
    assert text["mentioned_mobile_list"] == ["13800000000"]
    assert text["content"].endswith(f"Grafana: {GRAFANA_OPEN}\nTimeline: {TIMELINE}")
    md_who = Mentions({Severity.CRITICAL: Mention(user_ids=("zhangsan",))})
    md = body(WeComChannel("w", URL, links=LINKS, mentions=md_who).build(ONE, NOW_S).body)
    assert md["markdown"]["content"].endswith(
        f"[Grafana]({GRAFANA_OPEN}) · [Timeline]({TIMELINE})\n<@zhangsan>")


def test_webhook_notices_carry_severity_kind_and_links() -> None:
    [n] = body(WebhookChannel("h", URL, links=LINKS).build(ONE, NOW_S).body)["notices"]
    assert (n["severity"], n["verdict_kind"]) == ("critical", "process_exit")
    assert n["links"] == {"grafana": GRAFANA_OPEN, "timeline": TIMELINE}


def test_alertmanager_labels_for_routing_and_generator_url() -> None:
    ch = AlertmanagerChannel("am", "http://127.0.0.1:9093", links=LINKS)
    [alert] = body(ch.build(ONE, NOW_S).body)
    assert alert["labels"] == {"alertname": "TrainguardIncident", "incident_id": INC,
                               "job_id": "job demo", "source": "trainguard",
                               "severity": "critical", "verdict_kind": "process_exit",
                               "node": "node-a", "rank": "3"}
    assert alert["generatorURL"] == TIMELINE
    assert alert["annotations"]["grafana_url"] == GRAFANA_OPEN
    assert alert["annotations"]["timeline_url"] == TIMELINE
    # relocated later: the labels (the alert's identity) stay, "where" says where it is now
    [moved] = body(ch.build(Message((notice(node="node-b"),)), NOW_S).body)
    assert moved["labels"] == alert["labels"]
    assert moved["annotations"]["where"] == "node node-b, rank 3"
    [bare] = body(AlertmanagerChannel("am", "http://h").build(ONE, NOW_S).body)
    assert "generatorURL" not in bare and "grafana_url" not in bare["annotations"]


CONFIG = """
links: {grafana_url: "https://grafana.example.org", timeline_url: "http://127.0.0.1:8470",
        pad_s: 120}
channels:
  - name: slack
    type: slack
    url: {env: SLACK_URL}
    mentions: {critical: {user_ids: [U01ABC], group_ids: [S02XYZ]}, warning: {user_ids: [W1X]}}
  - {name: wecom, type: wecom, url: {env: SLACK_URL}, msgtype: text,
     mentions: {critical: {mobiles: ["+86-13800000000"], all: true}}}
  - {name: am, type: alertmanager, url: "http://127.0.0.1:9093"}
"""
ENV = {"SLACK_URL": "https://hooks.slack.com/services/T1/B2/slacktokenslacktoken1"}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "alerts.yaml"
    path.write_text(text)
    return path


def test_config_links_and_mentions_reach_the_channels(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, CONFIG), ENV)
    slack, wecom, am = (b.channel for b in cfg.channels)
    assert isinstance(slack, SlackChannel) and isinstance(wecom, WeComChannel)
    assert isinstance(am, AlertmanagerChannel)
    assert slack.links == am.links == cfg.links
    assert cfg.links.grafana_url == "https://grafana.example.org" and cfg.links.pad_s == 120
    assert slack.mentions.by_severity[Severity.WARNING] == Mention(user_ids=("W1X",))
    assert wecom.mentions.by_severity[Severity.CRITICAL] == Mention(
        mobiles=("+86-13800000000",), all=True)


@pytest.mark.parametrize(("text", "field", "reason"), [
    ("links: {grafana_url: 'ftp://g'}", "links.grafana_url", "http(s) URL with a host"),
    ("links: {timeline_url: 'http://h/x?a=1'}", "links.timeline_url", "no query"),
    ("links: {grafana_url: 'http://g/(x)'}", "links.grafana_url", "<>|()[]"),
    ("links: {dashboard_uid: 'a b'}", "links.dashboard_uid", "pattern"),
    ("links: {pad_s: -1}", "links.pad_s", "greater than or equal"),
    ("links: {colour: red}", "links.colour", "Extra"),
])
def test_bad_links_name_the_field_and_value(tmp_path: Path, text: str, field: str,
                                            reason: str) -> None:
    doc = text + "\nchannels: [{name: am, type: alertmanager, url: 'http://h:9093'}]\n"
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, doc), ENV)
    assert err.value.field == field
    assert reason in err.value.reason
    assert "\n" not in str(err.value)


SLACK = "{name: s, type: slack, url: {env: SLACK_URL}, "


@pytest.mark.parametrize(("channel", "field", "reason"), [
    (SLACK + "mentions: {critical: {user_ids: ['<!channel>']}}}",
     "channels.0.mentions.critical.user_ids.0", "not a Slack user id (U…/W…) (got '<!channel>')"),
    (SLACK + "mentions: {critical: {group_ids: [U123]}}}",
     "channels.0.mentions.critical.group_ids.0", "Slack user group id"),
    (SLACK + "mentions: {critical: {mobiles: ['13800000000']}}}",
     "channels.0.mentions.critical.mobiles", "slack cannot mention by mobiles"),
    (SLACK + "mentions: {urgent: {all: true}}}", "channels.0.mentions.urgent.[key]",
     "'critical'"),
    ("{name: w, type: wecom, url: {env: SLACK_URL}, mentions: {critical: {all: true}}}",
     "channels.0.mentions.critical.all", "in markdown messages (use msgtype: text)"),
    ("{name: d, type: dingtalk, url: {env: SLACK_URL}, "
     "mentions: {warning: {mobiles: ['call me']}}}",
     "channels.0.mentions.warning.mobiles.0", "not a mobile number"),
    ("{name: f, type: feishu, url: {env: SLACK_URL}, mentions: {info: {group_ids: [S1]}}}",
     "channels.0.mentions.info.group_ids", "feishu cannot mention by group_ids"),
    ("{name: am, type: alertmanager, url: 'http://h', mentions: {info: {all: true}}}",
     "channels.0.mentions", "alertmanager has no mentions"),
])
def test_bad_mentions_name_the_field_and_value(tmp_path: Path, channel: str, field: str,
                                               reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, f"channels: [{channel}]\n"), ENV)
    assert err.value.field == field
    assert reason in err.value.reason


def test_transitions_carry_the_opening_verdicts_severity_and_kind_to_the_notices() -> None:
    from trainguard.alerts.coalesce import Coalescer
    from trainguard.alerts.model import transition_from_event
    from trainguard.events.payloads import Verdict
    from trainguard.incidents import rebuild_incidents
    from trainguard.incidents.synth import incident_log

    log = incident_log()
    book = rebuild_incidents(log)["job-a"]
    verdicts = {e.payload.verdict_id: e.payload for e in log if isinstance(e.payload, Verdict)}
    coalescer = Coalescer(hold_s=0)
    for inc in book.incidents.values():
        opening = verdicts[next(iter(inc.verdicts))]
        for ev in inc.transitions:
            t = transition_from_event(ev)
            assert t is not None
            assert (t.severity, t.verdict_kind) == (opening.severity, opening.kind)
            coalescer.offer(t, 0.0)
    notices = coalescer.due(1.0)
    assert notices and all(n.severity is not None and n.verdict_kind is not None
                           for n in notices)
