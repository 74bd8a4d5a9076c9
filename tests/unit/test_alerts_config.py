"""The alerts config: channels built from YAML, secrets from env or files, errors name fields."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.alerts.channels.alertmanager import AlertmanagerChannel
from trainguard.alerts.channels.dingtalk import DingTalkChannel
from trainguard.alerts.channels.feishu import FeishuChannel
from trainguard.alerts.channels.slack import SlackChannel
from trainguard.alerts.channels.webhook import WebhookChannel
from trainguard.alerts.channels.wecom import WeComChannel
from trainguard.alerts.config import ConfigError, load
from trainguard.alerts.ratelimit import Limit

GOOD = """
coalesce: {hold_s: 1.5}
channels:
  - {name: slack, type: slack, url: {env: SLACK_URL}}
  - {name: feishu, type: feishu, url: {file: FEISHU_FILE}, secret: {env: FEISHU_SECRET}}
  - {name: ding, type: dingtalk, url: {env: DING_URL}, secret: {env: DING_SECRET},
     msgtype: text, limits: [{count: 10, per_s: 60}]}
  - {name: wecom, type: wecom, url: {env: WECOM_URL}}
  - {name: hook, type: webhook, url: "http://127.0.0.1:8080/hook", secret: {env: HOOK_SECRET},
     retry: {max_attempts: 2, base_s: 0.1, cap_s: 1}}
  - {name: am, type: alertmanager, url: "http://127.0.0.1:9093", resend_s: 30}
"""
ENV = {"SLACK_URL": "https://hooks.slack.com/services/T1/B2/slacktokenslacktoken1",
       "FEISHU_SECRET": "feishu-secret-1", "DING_URL": "https://oapi.dingtalk.com/robot/send?"
       "access_token=dingtoken123", "DING_SECRET": "SECding", "WECOM_URL":
       "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=wecomkey-1",
       "HOOK_SECRET": "hook-secret-1"}


def write(tmp_path: Path, text: str) -> Path:
    feishu = tmp_path / "feishu_url"
    feishu.write_text("https://open.feishu.cn/open-apis/bot/v2/hook/feishu-hook-uuid\n")
    path = tmp_path / "alerts.yaml"
    path.write_text(text.replace("FEISHU_FILE", str(feishu)))
    return path


def test_every_channel_type_is_built_with_its_secrets(tmp_path: Path) -> None:
    cfg = load(write(tmp_path, GOOD), ENV)
    chans = [b.channel for b in cfg.channels]
    assert [type(c) for c in chans] == [SlackChannel, FeishuChannel, DingTalkChannel,
                                        WeComChannel, WebhookChannel, AlertmanagerChannel]
    feishu = chans[1]
    assert isinstance(feishu, FeishuChannel) and feishu.secret is not None
    assert feishu.url.reveal().endswith("/feishu-hook-uuid")
    ding = chans[2]
    assert isinstance(ding, DingTalkChannel)
    assert ding.msgtype == "text" and ding.policy.limits == (Limit(10, 60.0),)
    assert chans[0].policy.limits == (Limit(1, 1.0),)  # the vendor's default
    assert cfg.channels[4].backoff.max_attempts == 2
    assert chans[5].policy.resend_s == 30
    assert cfg.coalesce.hold_s == 1.5
    scrubbed = cfg.redactor.scrub(" ".join(ENV.values()) + " feishu-hook-uuid")
    for token in ("slacktokenslacktoken1", "feishu-secret-1", "dingtoken123", "SECding",
                  "wecomkey-1", "hook-secret-1", "feishu-hook-uuid"):
        assert token not in scrubbed
    assert "Secret('***')" in repr(feishu)


@pytest.mark.parametrize(("text", "field", "reason"), [
    ("channels: [{name: s, type: slack, url: 'https://hooks.slack.com/services/x'}]",
     "channels.0", "carries its token"),
    ("channels: [{name: s, type: slack, url: {env: NOPE}}]", "channels.0.url",
     "NOPE is not set"),
    ("channels: [{name: s, type: slack, url: {env: A, file: /x}}]", "channels.0.url",
     "exactly one"),
    ("channels: [{name: s, type: slack, url: {file: /does/not/exist}}]", "channels.0.url",
     "cannot read"),
    ("channels: [{name: s, type: wecom, url: {env: SLACK_URL}, secret: {env: X}}]",
     "channels.0", "no signature"),
    ("channels: [{name: a, type: webhook, url: 'http://h/x'}, "
     "{name: a, type: webhook, url: 'http://h/y'}]", "channels", "used twice"),
    ("channels: [{name: a, type: teams, url: 'http://h/x'}]", "channels.0.type", "Input"),
    ("channels: [{name: a, type: webhook, url: 'http://h/x', colour: red}]",
     "channels.0.colour", "Extra"),
    ("channels: [{name: a, type: webhook, url: 'ftp://h/x'}]", "channels.0.url", "http(s)"),
    ("channels: []", "channels", "at least 1"),
    ("coalesce: {hold_s: -1}\nchannels: [{name: a, type: webhook, url: 'http://h/x'}]",
     "coalesce.hold_s", "greater than or equal"),
])
def test_bad_config_names_the_field(tmp_path: Path, text: str, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, text), ENV)
    assert err.value.field == field
    assert reason in err.value.reason


def test_a_bad_secret_url_is_refused_without_repeating_it(tmp_path: Path) -> None:
    env = {"SLACK_URL": "not a url but a secret-token-123"}
    with pytest.raises(ConfigError) as err:
        load(write(tmp_path, "channels: [{name: s, type: slack, url: {env: SLACK_URL}}]"), env)
    assert err.value.field == "channels.0.url"
    assert "secret-token-123" not in str(err.value)


def test_unreadable_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not YAML"):
        load(write(tmp_path, "channels: [unclosed"), ENV)


def test_cli_check_lists_channels_without_secrets(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainguard.cli.main import main

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    assert main(["alerts", "check", "--config", str(write(tmp_path, GOOD))]) == 0
    out = capsys.readouterr().out
    assert "ding: dingtalk, limits 10/60s, up to 5 attempts" in out
    assert "am: alertmanager, limits 10/1s, up to 5 attempts, re-sent every 30s" in out
    for value in ENV.values():
        assert value not in out
    monkeypatch.delenv("SLACK_URL")
    assert main(["alerts", "check", "--config", str(write(tmp_path, GOOD))]) == 2
    err = capsys.readouterr().err
    assert "channels.0.url: environment variable SLACK_URL" in err and err.count("\n") == 1
