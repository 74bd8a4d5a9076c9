"""One escaping function per output format, for user-controlled text: job, node and rank
names, reasons, evidence. Pure.

Every format starts from ``plain``: control characters (C0/C1, format characters such as
bidirectional overrides and zero-width spaces, line and paragraph separators) and the
backslash are written as backslash escapes, so a name can neither forge a line of its own
("node x\\nstate: recovered") nor reorder what a reader sees. ``unplain`` undoes it: the
visible text of every format below is ``plain(text)``, which round-trips to ``text``.

- ``markdown`` (CommonMark / GFM: the timeline's Markdown, DingTalk and WeCom markdown):
  ``&``, ``<`` and ``>`` as character references, so no raw HTML, autolink or WeCom ``<@id>``
  mention can form, whatever the renderer does with backslashes; the characters that open
  inline constructs (emphasis, code, links and images, headings, tables, strikethrough)
  backslash-escaped, and a list or heading marker at the start. Parentheses, ``!``, ``.``
  stay as they are (they form nothing without ``[``), so the source stays readable. Bare URLs
  still become links where a renderer autolinks them (GFM does): visible text, not markup.
- ``slack`` (mrkdwn): ``&``, ``<`` and ``>`` as ``&amp;``, ``&lt;``, ``&gt;``, Slack's own
  rule: ``<!channel>``, ``<@U123>`` and ``<url|text>`` cannot form. Slack has no escape for
  ``*``, ``_``, ``~``, `````: they can only style, never link or mention.
- ``feishu`` (Feishu/Lark post ``text`` tags and titles, shown verbatim, no references
  decoded): a zero-width space after every ``<`` so no ``<at user_id=...>`` mention forms;
  ``plain`` has already written any zero-width space of the input as ``\\u200b``, so the only
  ones left are these and removing them gives the visible text back.
- ``html`` (the timeline page): ``html.escape`` with quotes, for text and attribute values.
- JSON bodies (the generic webhook, Alertmanager) are escaped by ``json.dumps``; their
  human-readable text fields are ``plain``.
"""

from __future__ import annotations

import html as _html
import re
import unicodedata

ZWSP = "\u200b"
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\"}
_UNNAMED = {v: k for k, v in _NAMED.items()}
_MD_BACKSLASHED = frozenset("\\`*_[]#|~")  # inline constructs, wherever they are
# block markers count only at the start of a line: escaped text has no line break, so only its
# own start can be one (a list item, a setext underline, an ordered list "1.")
_MD_LINE_START = re.compile(r" {0,3}(?:[-+=]|[0-9]{1,9}[.)])")
_MD_REFS = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_PLAIN_ESCAPE = re.compile(r"\\(?:[nrt\\]|x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")


def _hidden(ch: str) -> bool:
    return unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")


def _escape_char(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    if not _hidden(ch):
        return ch
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def plain(text: str) -> str:
    """Control and format characters, separators and ``\\`` as backslash escapes."""
    return "".join(_escape_char(ch) for ch in text)


def unplain(text: str) -> str:
    """The inverse of ``plain``."""
    def one(m: re.Match[str]) -> str:
        s = m.group(0)
        return _UNNAMED[s] if s in _UNNAMED else chr(int(s[2:], 16))

    return _PLAIN_ESCAPE.sub(one, text)


def markdown(text: str) -> str:
    """User text inside CommonMark/GFM: no HTML, no Markdown construct, one line."""
    text = plain(text)
    head = ""
    marker = _MD_LINE_START.match(text)
    if marker:  # "\-", "1\.": the marker taken literally
        head = text[: marker.end() - 1] + "\\" + text[marker.end() - 1]
        text = text[marker.end():]
    return head + "".join(_MD_REFS.get(ch) or ("\\" + ch if ch in _MD_BACKSLASHED else ch)
                          for ch in text)


def slack(text: str) -> str:
    """User text inside Slack mrkdwn: ``&``, ``<``, ``>`` as Slack's references."""
    return plain(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def unslack(text: str) -> str:
    """What Slack shows for ``text`` (its three references decoded)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def feishu(text: str) -> str:
    """User text inside a Feishu/Lark post: no ``<at ...>`` mention can form."""
    return plain(text).replace("<", "<" + ZWSP)


def html(text: str) -> str:
    """User text inside HTML, as element content or a quoted attribute value."""
    return _html.escape(plain(text), quote=True)
