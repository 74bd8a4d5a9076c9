"""The alerts config file (YAML): channels, their secrets (from the environment or files, never
inline for tokens), coalescing. Bad input fails with the dotted path of the bad field.

    coalesce: {hold_s: 2, retain_s: 86400}
    channels:
      - {name: ops-slack, type: slack, url: {env: SLACK_WEBHOOK_URL}}
      - {name: ops-feishu, type: feishu, url: {file: /run/secrets/feishu_url},
         secret: {env: FEISHU_SECRET}}
      - {name: am, type: alertmanager, url: "http://alertmanager:9093", resend_s: 60}
    links: {grafana_url: "http://grafana:3000", timeline_url: "http://incidents:8470"}

A chat channel may mention people per severity (``mentions: {critical: {user_ids: [...]}}``);
which fields each vendor takes, and their id syntax, is ``MENTION_FIELDS`` and ``ID_SYNTAX``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from trainguard.alerts.backoff import Backoff
from trainguard.alerts.channels.alertmanager import ALERTMANAGER_LIMITS, AlertmanagerChannel
from trainguard.alerts.channels.base import Channel
from trainguard.alerts.channels.dingtalk import DINGTALK_LIMITS, DingTalkChannel
from trainguard.alerts.channels.feishu import FEISHU_LIMITS, FeishuChannel
from trainguard.alerts.channels.slack import SLACK_LIMITS, SlackChannel
from trainguard.alerts.channels.webhook import WEBHOOK_LIMITS, WebhookChannel
from trainguard.alerts.channels.wecom import WECOM_LIMITS, WeComChannel
from trainguard.alerts.links import (
    DEFAULT_PAD_S,
    INCIDENTS_DASHBOARD_UID,
    JOB_DASHBOARD_UID,
    NO_LINKS,
    Links,
)
from trainguard.alerts.mentions import Mention, Mentions
from trainguard.alerts.ratelimit import Limit
from trainguard.alerts.secrets import Redactor, Secret, url_secret_parts
from trainguard.configfile import ConfigFileError, load_yaml, show
from trainguard.events.payloads import Severity

DAY_S = 86_400.0
# every duration: finite, positive where it must be, and at most a year
Seconds = Annotated[float, Field(ge=0, le=365 * DAY_S, allow_inf_nan=False)]
PositiveSeconds = Annotated[float, Field(gt=0, le=365 * DAY_S, allow_inf_nan=False)]

ChannelType = Literal["slack", "feishu", "dingtalk", "wecom", "webhook", "alertmanager"]
# Their URL is the credential: it must come from the environment or a file.
TOKEN_URL_TYPES = frozenset({"slack", "feishu", "dingtalk", "wecom"})
SIGNED_TYPES = frozenset({"feishu", "dingtalk", "webhook"})
DEFAULT_LIMITS: dict[str, tuple[Limit, ...]] = {
    "slack": SLACK_LIMITS, "feishu": FEISHU_LIMITS, "dingtalk": DINGTALK_LIMITS,
    "wecom": WECOM_LIMITS, "webhook": WEBHOOK_LIMITS, "alertmanager": ALERTMANAGER_LIMITS,
}


# The mention fields each chat channel takes, and the syntax of each vendor's ids: an id goes
# into the message as it is, so nothing but an id may pass.
MENTION_FIELDS: dict[str, frozenset[str]] = {
    "slack": frozenset({"user_ids", "group_ids", "all"}),
    "feishu": frozenset({"user_ids", "all"}),
    "dingtalk": frozenset({"user_ids", "mobiles", "all"}),
    "wecom": frozenset({"user_ids", "mobiles", "all"}),
}
WECOM_MARKDOWN_FIELDS = frozenset({"user_ids"})  # WeCom markdown mentions only <@userid>
_MOBILE = re.compile(r"\+?[0-9][0-9-]{4,19}")
ID_SYNTAX: dict[tuple[str, str], tuple[re.Pattern[str], str]] = {
    ("slack", "user_ids"): (re.compile(r"[UW][A-Z0-9]{2,20}"), "a Slack user id (U…/W…)"),
    ("slack", "group_ids"): (re.compile(r"S[A-Z0-9]{2,20}"), "a Slack user group id (S…)"),
    ("feishu", "user_ids"): (re.compile(r"[A-Za-z0-9_-]{1,64}"),
                             "a Feishu open_id/user_id (letters, digits, _ and -)"),
    ("dingtalk", "user_ids"): (re.compile(r"[A-Za-z0-9_-]{1,64}"),
                               "a DingTalk userid (letters, digits, _ and -)"),
    ("dingtalk", "mobiles"): (_MOBILE, "a mobile number (digits, an optional + and -)"),
    ("wecom", "user_ids"): (re.compile(r"[A-Za-z0-9_.-]{1,64}"),
                            "a WeCom userid (letters, digits, _ . and -; all: true for @all)"),
    ("wecom", "mobiles"): (_MOBILE, "a mobile number (digits, an optional + and -)"),
}
# a base URL is put into Markdown links and Slack's <url|text>: none of these may appear
_URL_BREAKERS = frozenset(" \t\r\n<>|()[]\"'`\\")


class ConfigError(ValueError):
    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SecretSource(_Model):
    env: Annotated[str, Field(min_length=1)] | None = None
    file: Path | None = None

    @model_validator(mode="after")
    def _one(self) -> SecretSource:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of env: NAME or file: PATH")
        return self


class LimitSpec(_Model):
    count: Annotated[int, Field(ge=1, le=1_000_000)]
    per_s: PositiveSeconds


class RetrySpec(_Model):
    max_attempts: Annotated[int, Field(ge=1, le=20)] = 5
    base_s: Annotated[float, Field(ge=0, le=DAY_S, allow_inf_nan=False)] = 0.5
    cap_s: Annotated[float, Field(gt=0, le=DAY_S, allow_inf_nan=False)] = 30.0


class MentionSpec(_Model):
    user_ids: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=50)] = []
    group_ids: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=50)] = []
    mobiles: Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=50)] = []
    all: bool = False


def _base_url(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError("not an http(s) URL with a host")
    if any(ch in _URL_BREAKERS for ch in value) or parts.query or parts.fragment:
        raise ValueError("a base URL: no query, fragment, spaces, quotes, <>|()[] or \\")
    return value


class LinksSpec(_Model):
    grafana_url: str | None = None  # e.g. http://grafana:3000 (the dashboards' Grafana)
    timeline_url: str | None = None  # `trainguard incident serve --http-port`'s base URL
    dashboard_uid: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,40}$")] = JOB_DASHBOARD_UID
    digest_dashboard_uid: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,40}$")] = \
        INCIDENTS_DASHBOARD_UID
    pad_s: Annotated[float, Field(ge=0, le=DAY_S, allow_inf_nan=False)] = DEFAULT_PAD_S

    @field_validator("grafana_url", "timeline_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return _base_url(value)

    def links(self) -> Links:
        return Links(self.grafana_url, self.timeline_url, self.dashboard_uid,
                     self.digest_dashboard_uid, self.pad_s)


class ChannelSpec(_Model):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    type: ChannelType
    url: str | SecretSource
    secret: SecretSource | None = None
    bearer_token: SecretSource | None = None
    msgtype: Literal["markdown", "text"] = "markdown"
    limits: list[LimitSpec] | None = None
    max_individual: Annotated[int, Field(ge=1, le=50)] = 5
    resend_s: PositiveSeconds = 60.0
    timeout_s: Annotated[float, Field(gt=0, le=120, allow_inf_nan=False)] = 10.0
    retry: RetrySpec = RetrySpec()
    mentions: dict[Severity, MentionSpec] = {}

    @model_validator(mode="after")
    def _fits_type(self) -> ChannelSpec:
        if self.type in TOKEN_URL_TYPES and isinstance(self.url, str):
            raise ValueError(f"url: a {self.type} webhook URL carries its token; give it as "
                             "{env: NAME} or {file: PATH}, not inline")
        if self.secret is not None and self.type not in SIGNED_TYPES:
            raise ValueError(f"secret: {self.type} has no signature; remove it")
        if self.bearer_token is not None and self.type != "alertmanager":
            raise ValueError("bearer_token: only for alertmanager")
        return self


class CoalesceSpec(_Model):
    hold_s: Annotated[float, Field(ge=0, le=600, allow_inf_nan=False)] = 2.0
    flush_s: Annotated[float, Field(ge=0.05, le=60, allow_inf_nan=False)] = 1.0
    retain_s: Seconds = DAY_S


class AlertsFile(_Model):
    channels: Annotated[list[ChannelSpec], Field(min_length=1)]
    coalesce: CoalesceSpec = CoalesceSpec()
    links: LinksSpec = LinksSpec()

    @field_validator("channels")
    @classmethod
    def _unique(cls, channels: list[ChannelSpec]) -> list[ChannelSpec]:
        seen: set[str] = set()
        for spec in channels:
            if spec.name in seen:
                raise ValueError(f"channel name {spec.name!r} is used twice")
            seen.add(spec.name)
        return channels


@dataclass(frozen=True)
class BuiltChannel:
    channel: Channel
    backoff: Backoff
    timeout_s: float


@dataclass(frozen=True)
class AlertsConfig:
    channels: tuple[BuiltChannel, ...]
    coalesce: CoalesceSpec
    redactor: Redactor
    links: Links = NO_LINKS


def parse(doc: object) -> AlertsFile:
    try:
        return AlertsFile.model_validate(doc)
    except ValidationError as exc:
        errors = exc.errors()
        # a union reports one error per member: the one that is not a type mismatch says more
        err = next((e for e in errors if not e["type"].endswith("_type")), errors[0])
        loc = [str(p) for p in err["loc"] if not _union_tag(p)]
        scalar = isinstance(err.get("input"), str | int | float | None)
        got = f" (got {show(err['input'])})" if "input" in err and scalar else ""
        raise ConfigError(".".join(loc) or "(file)", err["msg"] + got) from None


def _union_tag(part: object) -> bool:
    return isinstance(part, str) and (part == "str" or "SecretSource" in part)


def load(path: Path, environ: Mapping[str, str] | None = None) -> AlertsConfig:
    try:
        doc = load_yaml(path)
    except ConfigFileError as exc:
        raise ConfigError(exc.where, exc.reason) from None
    return build(parse(doc), os.environ if environ is None else environ)


def resolve(source: SecretSource, field: str, environ: Mapping[str, str]) -> Secret:
    if source.env is not None:
        value = environ.get(source.env)
        if not value:
            raise ConfigError(field, f"environment variable {source.env} is not set")
        return Secret(value.strip())
    assert source.file is not None
    try:
        value = source.file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(field, f"cannot read {source.file}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(field, f"{source.file} is not valid UTF-8") from None
    if not value:
        raise ConfigError(field, f"{source.file} is empty")
    return Secret(value)


def mentions(ch: ChannelSpec, where: str) -> Mentions:
    """The channel's mentions, each id checked against its vendor's syntax."""
    if not ch.mentions:
        return Mentions()
    allowed = MENTION_FIELDS.get(ch.type)
    if allowed is None:
        raise ConfigError(f"{where}.mentions", f"{ch.type} has no mentions; remove it")
    if ch.type == "wecom" and ch.msgtype == "markdown":
        allowed = WECOM_MARKDOWN_FIELDS
    out: dict[Severity, Mention] = {}
    for severity, spec in ch.mentions.items():
        at = f"{where}.mentions.{severity.value}"
        for name in ("user_ids", "group_ids", "mobiles", "all"):
            if getattr(spec, name) and name not in allowed:
                why = (" in markdown messages (use msgtype: text)"
                       if ch.type == "wecom" and name in MENTION_FIELDS["wecom"] else "")
                raise ConfigError(f"{at}.{name}", f"{ch.type} cannot mention by {name}{why}")
            if name == "all":
                continue
            pattern, what = ID_SYNTAX.get((ch.type, name), (None, ""))
            for i, value in enumerate(getattr(spec, name)):
                if pattern is not None and not pattern.fullmatch(value):
                    raise ConfigError(f"{at}.{name}.{i}", f"not {what} (got {show(value)})")
        out[severity] = Mention(tuple(spec.user_ids), tuple(spec.group_ids),
                                tuple(spec.mobiles), spec.all)
    return Mentions(out)


def build(spec: AlertsFile, environ: Mapping[str, str]) -> AlertsConfig:
    redactor = Redactor()
    links = spec.links.links()
    built: list[BuiltChannel] = []
    for i, ch in enumerate(spec.channels):
        where = f"channels.{i}"
        if isinstance(ch.url, str):
            url = Secret(ch.url)
        else:
            url = resolve(ch.url, f"{where}.url", environ)
            redactor.add(*url_secret_parts(url.reveal()))
        secrets = {}
        for field in ("secret", "bearer_token"):
            source: SecretSource | None = getattr(ch, field)
            if source is not None:
                secrets[field] = resolve(source, f"{where}.{field}", environ)
                redactor.add(secrets[field].reveal())
        _check_url(url.reveal(), f"{where}.url")
        channel = _channel(ch, url, secrets.get("secret"), secrets.get("bearer_token"), links,
                           mentions(ch, where))
        backoff = Backoff(base_s=ch.retry.base_s, cap_s=max(ch.retry.cap_s, ch.retry.base_s),
                          max_attempts=ch.retry.max_attempts)
        built.append(BuiltChannel(channel, backoff, ch.timeout_s))
    return AlertsConfig(tuple(built), spec.coalesce, redactor, links)


def _check_url(url: str, field: str) -> None:
    """A usable http(s) URL; the message never repeats the URL (it may carry a token)."""
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        ok = False
    if not ok:
        raise ConfigError(field, "not an http(s) URL with a host")


def _channel(ch: ChannelSpec, url: Secret, secret: Secret | None, bearer: Secret | None,
             links: Links, who: Mentions) -> Channel:
    limits = (DEFAULT_LIMITS[ch.type] if ch.limits is None
              else tuple(Limit(x.count, x.per_s) for x in ch.limits))
    n, m = ch.name, ch.max_individual
    if ch.type == "slack":
        return SlackChannel(n, url, limits=limits, max_individual=m, links=links, mentions=who)
    if ch.type == "feishu":
        return FeishuChannel(n, url, secret, limits=limits, max_individual=m, links=links,
                             mentions=who)
    if ch.type == "dingtalk":
        return DingTalkChannel(n, url, secret, msgtype=ch.msgtype, limits=limits,
                               max_individual=m, links=links, mentions=who)
    if ch.type == "wecom":
        return WeComChannel(n, url, msgtype=ch.msgtype, limits=limits, max_individual=m,
                            links=links, mentions=who)
    if ch.type == "webhook":
        return WebhookChannel(n, url, secret, limits=limits, max_individual=m, links=links)
    return AlertmanagerChannel(n, url.reveal(), resend_s=ch.resend_s, bearer_token=bearer,
                               limits=limits, links=links)
