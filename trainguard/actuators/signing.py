"""Signed commands: only the decision service, holding the key, can make the actuator act.

The signature is HMAC-SHA256 over the command's canonical bytes: the job id, the subject and
every payload field but ``signature`` itself, as sorted-key JSON. Moving a signature to another
job, rank or action invalidates it. The key comes from a file
(``TRAINGUARD_COMMAND_KEY_FILE``) or the environment (``TRAINGUARD_COMMAND_KEY``), never from
a topic. ``check`` is pure: it returns the reason a command must be refused, or None.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from pathlib import Path

import orjson

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import Command

ENV_KEY = "TRAINGUARD_COMMAND_KEY"
ENV_KEY_FILE = "TRAINGUARD_COMMAND_KEY_FILE"
SCHEME = "hmac-sha256:"
MIN_KEY_BYTES = 16


class SigningKeyError(ValueError):
    """The signing key is missing or unusable (the message names the setting)."""


def load_key(env: Mapping[str, str] | None = None, key_file: Path | None = None) -> bytes:
    env = os.environ if env is None else env
    path = key_file or (Path(env[ENV_KEY_FILE]) if env.get(ENV_KEY_FILE) else None)
    if path is not None:
        try:
            key = path.read_bytes().strip()
        except OSError as exc:
            raise SigningKeyError(f"{ENV_KEY_FILE}: cannot read {path}: {exc.strerror}") from None
        source = str(path)
    elif env.get(ENV_KEY):
        key, source = env[ENV_KEY].encode(), ENV_KEY
    else:
        raise SigningKeyError(f"no command signing key: set {ENV_KEY_FILE} (a secret file) or "
                        f"{ENV_KEY}")
    if len(key) < MIN_KEY_BYTES:
        raise SigningKeyError(f"command signing key from {source}: at least {MIN_KEY_BYTES} bytes "
                        f"(got {len(key)})")
    return key


def canonical(job_id: str, subject: Subject, command: Command) -> bytes:
    body = command.model_dump(mode="json", exclude={"signature"})
    doc = {"job_id": job_id, "subject": subject.model_dump(mode="json", exclude_none=True),
           "command": body}
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def _mac(key: bytes, job_id: str, subject: Subject, command: Command) -> str:
    return hmac.new(key, canonical(job_id, subject, command), hashlib.sha256).hexdigest()


def sign(key: bytes, job_id: str, subject: Subject, command: Command) -> Command:
    return command.model_copy(update={"signature": SCHEME + _mac(key, job_id, subject, command)})


def verify(key: bytes, event: Event) -> str | None:
    """Why this event is not a command signed with ``key``, or None when it is."""
    cmd = event.payload
    if not isinstance(cmd, Command):
        return f"not a command (type {event.type})"
    if not cmd.signature:
        return "unsigned command"
    if not cmd.signature.startswith(SCHEME):
        return f"signature: unknown scheme (expected {SCHEME}...)"
    want = _mac(key, event.job_id, event.subject, cmd)
    if not hmac.compare_digest(want, cmd.signature[len(SCHEME):]):
        return "signature: does not verify (forged or altered command)"
    return None


def freshness(cmd: Command, now_us: int, *, max_age_s: float,
              max_skew_s: float = 5.0) -> str | None:
    """Why this command is too old (or from the future) to act on, or None."""
    age_s = (now_us - cmd.issued_at) / 1e6
    if age_s > max_age_s:
        return f"stale: issued {age_s:.1f} s ago (max {max_age_s:.0f} s)"
    if age_s < -max_skew_s:
        return f"issued_at: {-age_s:.1f} s in the future (max skew {max_skew_s:.0f} s)"
    return None


def check(key: bytes, event: Event, now_us: int, *, max_age_s: float,
          max_skew_s: float = 5.0) -> str | None:
    """Signature, then freshness. The idempotency key (replays) is the ledger's business."""
    bad = verify(key, event)
    if bad is not None or not isinstance(event.payload, Command):
        return bad
    return freshness(event.payload, now_us, max_age_s=max_age_s, max_skew_s=max_skew_s)
