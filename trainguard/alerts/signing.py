"""Vendor signatures, pure (timestamps passed in).

- Feishu/Lark custom bot: ``sign = base64(hmac_sha256(key=f"{timestamp}\\n{secret}", msg=b""))``,
  timestamp in seconds, both sent in the JSON body; refused more than an hour off.
- DingTalk robot: ``sign = base64(hmac_sha256(key=secret, msg=f"{timestamp_ms}\\n{secret}"))``,
  sent URL-encoded as the ``timestamp`` and ``sign`` query parameters.
- trainguard's generic webhook: ``hex(hmac_sha256(key=secret, msg=f"{timestamp}.".encode() +
  body))`` in ``X-Trainguard-Signature: sha256=<hex>`` with ``X-Trainguard-Timestamp``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac


def feishu_sign(timestamp_s: int, secret: str) -> str:
    key = f"{timestamp_s}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def dingtalk_sign(timestamp_ms: int, secret: str) -> str:
    """The base64 signature; URL-encoding it is the query string's job."""
    msg = f"{timestamp_ms}\n{secret}".encode()
    return base64.b64encode(hmac.new(secret.encode(), msg, hashlib.sha256).digest()).decode()


def webhook_sign(timestamp_s: int, body: bytes, secret: str) -> str:
    digest = hmac.new(secret.encode(), f"{timestamp_s}.".encode() + body, hashlib.sha256)
    return "sha256=" + digest.hexdigest()
