"""Secrets: held in a type that never prints itself, and scrubbed from every log line.

Webhook URLs are secrets too (the token is in the path or the query), so a channel registers
its URL's secret parts with the ``Redactor``; the service puts a ``RedactingFilter`` on the log
handlers, and every error text a channel produces passes through ``Redactor.scrub``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from urllib.parse import parse_qsl, quote, quote_plus, urlsplit

MASK = "***"
MIN_SECRET_LEN = 6
MIN_TOKEN_SEGMENT = 16  # a path segment this long is taken for a token


class Secret:
    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def url_secret_parts(url: str) -> list[str]:
    """The parts of a webhook URL that carry its token: the whole URL, its path, its query
    values."""
    out = [url]
    try:
        parts = urlsplit(url)
    except ValueError:
        return out
    if len(parts.path) > 1:
        out.append(parts.path)
        out.extend(seg for seg in parts.path.split("/") if len(seg) >= MIN_TOKEN_SEGMENT)
    if parts.query:
        out.append(parts.query)
        out.extend(value for _key, value in parse_qsl(parts.query) if value)
    return out


def shown_url(url: str) -> str:
    """What may be printed about a secret URL: scheme and host only."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(unreadable URL)"
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}/{MASK}"


class Redactor:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets: set[str] = set()
        self.add(*secrets)

    def add(self, *secrets: str) -> None:
        for s in secrets:
            if len(s) < MIN_SECRET_LEN:
                continue
            self._secrets.update({s, quote(s, safe=""), quote_plus(s)})
        # longest first, so a URL goes before the token inside it
        self._ordered = sorted(self._secrets, key=len, reverse=True)

    def scrub(self, text: str) -> str:
        for s in self._ordered:
            if s in text:
                text = text.replace(s, MASK)
        return text


class RedactingFilter(logging.Filter):
    """Put on a handler: every record through it is scrubbed (message, arguments, traceback)."""

    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = self.redactor.scrub(record.getMessage())
        record.args = None
        if record.exc_info:
            if not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = self.redactor.scrub(record.exc_text)
            record.exc_info = None
        return True


def install_redaction(redactor: Redactor, logger: logging.Logger | None = None) -> None:
    """Scrub every handler of ``logger`` (default: the root logger)."""
    target = logger or logging.getLogger()
    for handler in target.handlers:
        if not any(isinstance(f, RedactingFilter) and f.redactor is redactor
                   for f in handler.filters):
            handler.addFilter(RedactingFilter(redactor))
