"""How a vendor's answer is judged: delivered, worth retrying, or refused for good. Pure.

Every vendor answers HTTP 200 to some errors: Feishu ``{"code": 19021, ...}`` (bad signature),
DingTalk and WeCom ``{"errcode": 130101 | 45009, ...}`` (sending too fast). A channel describes
its answers with a ``ReplyCheck``; ``judge`` applies it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainguard.compat import StrEnum


class Verdict(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    REFUSED = "refused"


@dataclass(frozen=True)
class ReplyCheck:
    code_keys: tuple[str, ...] = ()  # JSON fields holding the vendor's code; 0 means success
    retry_codes: frozenset[int] = field(default_factory=frozenset)
    ok_text: str | None = None  # a plain-text success body (Slack answers "ok")


@dataclass(frozen=True)
class Judged:
    verdict: Verdict
    detail: str
    retry_after_s: float | None = None


RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


def retry_after(headers: Mapping[str, str]) -> float | None:
    for key, value in headers.items():
        if key.lower() == "retry-after":
            try:
                return max(0.0, float(value))
            except ValueError:
                return None  # an HTTP date: fall back to our own backoff
    return None


def judge(status: int, body: bytes, headers: Mapping[str, str], check: ReplyCheck) -> Judged:
    text = body[:300].decode(errors="replace").strip()
    if status in RETRY_STATUS:
        return Judged(Verdict.RETRY, f"HTTP {status}: {text}", retry_after(headers))
    if not 200 <= status < 300:
        return Judged(Verdict.REFUSED, f"HTTP {status}: {text}")
    if check.code_keys:
        code = _vendor_code(body, check.code_keys)
        if code is None:
            return Judged(Verdict.REFUSED, f"HTTP {status} without a vendor code: {text}")
        if code == 0:
            return Judged(Verdict.DELIVERED, f"HTTP {status}")
        verdict = Verdict.RETRY if code in check.retry_codes else Verdict.REFUSED
        return Judged(verdict, f"vendor code {code}: {text}")
    if check.ok_text is not None and text != check.ok_text:
        return Judged(Verdict.REFUSED, f"HTTP {status}: {text}")
    return Judged(Verdict.DELIVERED, f"HTTP {status}")


def _vendor_code(body: bytes, keys: tuple[str, ...]) -> int | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    for key in keys:
        value = doc.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
