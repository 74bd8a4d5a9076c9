"""One escaping function per output format (trainguard.text.escape), property-tested against a
real renderer or the format's own rule: no control sequence of the format survives, and the
visible text is ``plain(text)``, which round-trips to ``text``. Then every chat channel and the
timeline with hostile names end to end."""

from __future__ import annotations

import dataclasses
import json
from html.parser import HTMLParser

from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from trainguard.alerts.channels.dingtalk import DingTalkChannel
from trainguard.alerts.channels.feishu import FeishuChannel
from trainguard.alerts.channels.slack import SlackChannel
from trainguard.alerts.channels.webhook import WebhookChannel
from trainguard.alerts.channels.wecom import WeComChannel
from trainguard.alerts.model import Notice, NoticeKind
from trainguard.alerts.render import Message
from trainguard.alerts.secrets import Secret
from trainguard.events.payloads import IncidentState
from trainguard.incidents import rebuild_incidents
from trainguard.incidents.synth import incident_log
from trainguard.text import escape
from trainguard.timeline import Timeline, build_timeline, render

HOSTILE = ("<!channel> <@U123> <at user_id=\"all\"></at> <script>x</script> **b** `c` "
           "[l](http://e) | # \n- i &amp; \u202e\u200b\\")
TEXT = st.text(st.one_of(st.sampled_from(list("<>&*_`[]()!#|~-+=.:/@\\ 1a\n\t\u200b\u202e\xa0")),
                         st.characters(exclude_categories=["Cs"])), max_size=40)
MD = MarkdownIt("commonmark").enable(["table", "strikethrough"])


class Html(HTMLParser):
    """Tags, attribute values and text of an HTML fragment (references decoded)."""

    def __init__(self, source: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: list[str] = []
        self.text = ""
        self.feed(source)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attrs += [v or "" for _k, v in attrs]

    def handle_data(self, data: str) -> None:
        self.text += data


def _visible(source: str) -> tuple[list[str], str]:
    page = Html(MD.render(source))
    return page.tags, page.text


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_plain_leaves_no_control_character_and_round_trips(text: str) -> None:
    out = escape.plain(text)
    assert not any(escape._hidden(ch) for ch in out)
    assert escape.unplain(out) == text


MD_CONTEXTS = [  # where user text sits: prefix, suffix, the tags the context itself makes
    ("", "", ["p"]),
    ("- x ", "", ["ul", "li"]),  # a bullet (chat markdown)
    ("**x", "x**", ["p", "strong"]),  # a bold title
    ("| h |\n|---|\n| ", " |", ["table", "thead", "tr", "th", "tbody", "tr", "td"]),
]


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_markdown_forms_no_construct_and_shows_the_text(text: str) -> None:
    shown = escape.plain(text)
    for prefix, suffix, tags in MD_CONTEXTS:
        got_tags, got_text = _visible(prefix + escape.markdown(text) + suffix)
        if not (prefix + shown + suffix).strip():
            continue  # nothing to show: an empty paragraph renders no tag at all
        assert got_tags == tags, (prefix, text, got_tags)
        visible = Html(MD.render(prefix + "y" + suffix)).text.replace("y", shown, 1)
        if prefix.startswith("**"):  # nothing trimmed here: every space shows
            assert got_text.strip("\n") == visible.strip("\n")
        else:  # paragraphs and cells trim the spaces at their ends
            assert "".join(got_text.split()) == "".join(visible.split())


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_slack_leaves_no_angle_bracket_and_shows_the_text(text: str) -> None:
    out = escape.slack(text)
    assert "<" not in out and ">" not in out
    assert out.replace("&amp;", "").replace("&lt;", "").replace("&gt;", "").count("&") == 0
    assert escape.unplain(escape.unslack(out)) == text


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_feishu_forms_no_tag_and_shows_the_text(text: str) -> None:
    out = escape.feishu(text)
    assert all(out[i + 1: i + 2] == escape.ZWSP for i, ch in enumerate(out) if ch == "<")
    assert escape.unplain(out.replace(escape.ZWSP, "")) == text


@settings(max_examples=400, deadline=None)
@given(TEXT)
def test_html_forms_no_tag_in_text_or_attribute_and_shows_the_text(text: str) -> None:
    page = Html(f'<p title="{escape.html(text)}">{escape.html(text)}</p>')
    assert page.tags == ["p"]
    assert page.attrs == [escape.plain(text)] and page.text == escape.plain(text)


# -- every channel and the timeline, end to end -------------------------------------------


def _notice(text: str) -> Notice:
    return Notice(kind=NoticeKind.OPENED, incident_id="a1b2c3d4e5f6a7b8c9d0", job_id=text,
                  state=IncidentState.LOCATED, opened_at_us=1_790_000_000_000_000,
                  at_us=1_790_000_042_000_000, transitions=3, reason=text, tier=1, node=text,
                  rank=3)


@settings(max_examples=100, deadline=None)
@given(st.one_of(st.just(HOSTILE), TEXT.filter(bool)))  # an empty reason or node shows no line
def test_every_chat_channel_escapes_names_and_reasons(text: str) -> None:
    url = Secret("https://example.invalid/hook")
    for digest in (False, True):
        m = Message((_notice(text),) if not digest else (_notice(text), _notice("ok")))
        slack = json.loads(SlackChannel("s", url).build(m, 0).body)["text"]
        assert "<" not in slack and ">" not in slack  # no <!channel>, <@U..>, <url|x>
        assert escape.slack(text) in slack
        post = json.loads(FeishuChannel("f", url).build(m, 0).body)["content"]["post"]["zh_cn"]
        for line in [post["title"]] + [c[0]["text"] for c in post["content"]]:
            assert "<at" not in line.lower()
        for channel in (DingTalkChannel("d", url), WeComChannel("w", url)):
            doc = json.loads(channel.build(m, 0).body)
            md = doc["markdown"].get("text") or doc["markdown"]["content"]
            tags, _shown = _visible(md)
            assert set(tags) <= {"p", "strong", "ul", "li"}, tags  # no HTML, no link
            assert "<" not in md  # nor a WeCom <@userid> mention, whatever the renderer
        for channel in (DingTalkChannel("d", url, msgtype="text"),
                        WeComChannel("w", url, msgtype="text")):
            content = json.loads(channel.build(m, 0).body)["text"]["content"]
            benign = json.loads(channel.build(
                Message(tuple(_notice("ok") for _ in m.notices)), 0).body)["text"]["content"]
            assert content.count("\n") == benign.count("\n")  # a name forges no line
        hook = json.loads(WebhookChannel("h", url).build(m, 0).body)
        assert hook["notices"][0]["node"] == text  # the data itself, JSON-escaped
        assert hook["text"].count("\n") == len(hook["text"].splitlines()) - 1


def _kill() -> Timeline:
    log = incident_log()
    incidents = rebuild_incidents(log)["job-a"].incidents.values()
    return [build_timeline(inc, log) for inc in incidents][-1]


KILL = _kill()


def _hostile_timeline(text: str) -> Timeline:
    return dataclasses.replace(
        KILL, job_id=text, subject=text,
        marks=[dataclasses.replace(m, lane=text, label=text, detail=text) for m in KILL.marks],
        transitions=[dataclasses.replace(s, reason=text) for s in KILL.transitions],
        answers=[dataclasses.replace(a, text=text) for a in KILL.answers])


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.just(HOSTILE), TEXT))
def test_the_timeline_passes_no_html_in_markdown_or_html(text: str) -> None:
    tl = _hostile_timeline(text)
    benign = _hostile_timeline("x")
    tags, _ = _visible(render(tl, "md"))
    assert sorted(tags) == sorted(_visible(render(benign, "md"))[0])
    page = Html(render(tl, "html"))
    assert sorted(page.tags) == sorted(Html(render(benign, "html")).tags)
