"""Ed25519 signatures: commands by ``decide``, outcomes and pool events by the actuators.

Who signs what is the registry's ``EventType.signed_by`` (``Signer.DECIDE``: ``command``;
``Signer.ACTUATOR``: ``command.outcome``, ``pool.unit``, ``replica.refused``). A signature is
``ed25519:<key id>:<128 hex>`` in the payload's ``signature`` field; the key id is the first
16 hex digits of the SHA-256 of the raw public key, so a reader with several trusted keys
(one per actuator) knows which one to try.

Canonical bytes (sorted-key JSON, the ``signature`` field left out):
- a command: the job id, the subject and every payload field (as before the switch from
  HMAC): moving a signature to another job, rank or action invalidates it;
- an actuator event: the whole envelope but ``ingest_time`` (stamped by the producer after
  signing): event id, type, job id, subject, event time, source and payload. A copy under
  another event id does not verify; the same record again is a duplicate (dedupe by id).

Keys never travel on a topic. ``decide`` holds the command private key; actuators hold its
public key and their own private key; every reader of outcomes holds the set of trusted
actuator public keys. A key is 32 raw bytes written as 64 hex digits on one line (``#``
comments and blank lines allowed; a public key file may hold several), or PEM (PKCS#8 private
/ SubjectPublicKeyInfo public, as ``openssl genpkey -algorithm ed25519`` writes). Each comes
from a file (``*_FILE``) or the environment; ``trainguard keys gen DIR`` makes a set.

``verify_*`` never raise on what a record carries (any text, any length): they return the
reason it must be refused, or None.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import Command, Payload
from trainguard.events.registry import BY_NAME, Signer

SCHEME = "ed25519"
# decide: the command private key
ENV_KEY = "TRAINGUARD_COMMAND_KEY"
ENV_KEY_FILE = "TRAINGUARD_COMMAND_KEY_FILE"
# actuators: decide's public key
ENV_PUB = "TRAINGUARD_COMMAND_PUBKEY"
ENV_PUB_FILE = "TRAINGUARD_COMMAND_PUBKEY_FILE"
# an actuator's own private key
ENV_ACTUATOR_KEY = "TRAINGUARD_ACTUATOR_KEY"
ENV_ACTUATOR_KEY_FILE = "TRAINGUARD_ACTUATOR_KEY_FILE"
# every reader of outcomes and pool events: the trusted actuator public keys
ENV_ACTUATOR_PUBS = "TRAINGUARD_ACTUATOR_PUBKEYS"
ENV_ACTUATOR_PUBS_FILE = "TRAINGUARD_ACTUATOR_PUBKEYS_FILE"

_SIG = re.compile(r"ed25519:([0-9a-f]{16}):([0-9a-f]{128})")
_HEX32 = re.compile(r"[0-9a-fA-F]{64}")


class SigningKeyError(ValueError):
    """A key is missing or unusable (the message names the setting or file)."""


def key_id(pub: Ed25519PublicKey) -> str:
    raw = pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


@dataclass(frozen=True)
class PrivateKey:
    key: Ed25519PrivateKey
    key_id: str

    @classmethod
    def of(cls, key: Ed25519PrivateKey) -> PrivateKey:
        return cls(key, key_id(key.public_key()))

    @classmethod
    def generate(cls) -> PrivateKey:
        return cls.of(Ed25519PrivateKey.generate())

    def public(self) -> PublicKey:
        return PublicKey.of(self.key.public_key())

    def sign(self, data: bytes) -> str:
        return f"{SCHEME}:{self.key_id}:{self.key.sign(data).hex()}"

    def hex(self) -> str:
        return self.key.private_bytes(serialization.Encoding.Raw,
                                      serialization.PrivateFormat.Raw,
                                      serialization.NoEncryption()).hex()


@dataclass(frozen=True)
class PublicKey:
    key: Ed25519PublicKey
    key_id: str

    @classmethod
    def of(cls, key: Ed25519PublicKey) -> PublicKey:
        return cls(key, key_id(key))

    def hex(self) -> str:
        return self.key.public_bytes(serialization.Encoding.Raw,
                                     serialization.PublicFormat.Raw).hex()


@dataclass(frozen=True)
class KeySet:
    """Trusted public keys by key id."""

    keys: Mapping[str, PublicKey] = field(default_factory=dict)

    @classmethod
    def of(cls, keys: Iterable[PublicKey]) -> KeySet:
        return cls({k.key_id: k for k in keys})

    def __bool__(self) -> bool:
        return bool(self.keys)

    def __or__(self, other: KeySet) -> KeySet:
        return KeySet({**self.keys, **other.keys})

    def verify(self, signature: object, data: bytes) -> str | None:
        """Why ``signature`` is not a signature of ``data`` by one of these keys, or None."""
        if signature is None or signature == "":
            return "unsigned"
        if not isinstance(signature, str):
            return "signature: not text"
        m = _SIG.fullmatch(signature)
        if m is None:
            return (f"signature: malformed (expected {SCHEME}:<16 hex key id>:<128 hex>, got "
                    f"{signature[:40]!a}{'...' if len(signature) > 40 else ''})")
        pub = self.keys.get(m.group(1))
        if pub is None:
            return f"signature: key {m.group(1)} is not trusted"
        try:
            pub.key.verify(bytes.fromhex(m.group(2)), data)
        except InvalidSignature:
            return "signature: does not verify (forged or altered)"
        return None


# --- canonical bytes ------------------------------------------------------------------------


def canonical(job_id: str, subject: Subject, command: Command) -> bytes:
    """A command's signed bytes: job id, subject and the payload but its signature."""
    body = command.model_dump(mode="json", exclude={"signature"})
    doc = {"job_id": job_id, "subject": subject.model_dump(mode="json", exclude_none=True),
           "command": body}
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def canonical_event(event: Event) -> bytes:
    """An actuator event's signed bytes: the envelope but ``ingest_time``, the payload but its
    signature."""
    doc = {"event_id": event.event_id, "type": event.type, "job_id": event.job_id,
           "subject": event.subject.model_dump(mode="json", exclude_none=True),
           "event_time": event.event_time, "source": event.source,
           "payload": event.payload.model_dump(mode="json", exclude={"signature"})}
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


# --- signing ----------------------------------------------------------------------------------


def sign(key: PrivateKey, job_id: str, subject: Subject, command: Command) -> Command:
    return command.model_copy(update={"signature": key.sign(canonical(job_id, subject,
                                                                       command))})


def sign_event(key: PrivateKey, event: Event) -> Event:
    """The event with its payload signed (for the types ``signed_by`` an actuator)."""
    payload = event.payload.model_copy(update={"signature": None})
    unsigned = event.model_copy(update={"payload": payload})
    sig = key.sign(canonical_event(unsigned))
    return event.model_copy(update={"payload": payload.model_copy(update={"signature": sig})})


def sign_log(events: Iterable[Event], command_key: PrivateKey,
             actuator_key: PrivateKey) -> list[Event]:
    """Every event of a signed type signed by its signer (synthetic logs for tests, drills and
    the demo: what decide and the actuator would have written)."""
    out: list[Event] = []
    for ev in events:
        signer = BY_NAME[ev.type].signed_by
        if signer is Signer.DECIDE and isinstance(ev.payload, Command):
            ev = ev.model_copy(update={"payload": sign(command_key, ev.job_id, ev.subject,
                                                       ev.payload)})
        elif signer is Signer.ACTUATOR:
            ev = sign_event(actuator_key, ev)
        out.append(ev)
    return out


def _signature(payload: Payload) -> object:
    return getattr(payload, "signature", None)


def verify(keys: KeySet, event: Event) -> str | None:
    """Why this event is not a command signed by one of ``keys``, or None when it is."""
    cmd = event.payload
    if not isinstance(cmd, Command):
        return f"not a command (type {event.type})"
    bad = keys.verify(cmd.signature, canonical(event.job_id, event.subject, cmd))
    return None if bad is None else f"command {bad}"


def verify_event(keys: KeySet, event: Event) -> str | None:
    """Why this actuator event is not signed by one of ``keys``, or None when it is."""
    bad = keys.verify(_signature(event.payload), canonical_event(event))
    return None if bad is None else f"{event.type} {bad}"


@dataclass(frozen=True)
class Trust:
    """What a service believes: the event types the registry says must be signed, checked
    against the keys configured to it. A type whose signer has no key here is never
    believed (an empty key set trusts nobody, it does not switch checking off)."""

    decide: KeySet = field(default_factory=KeySet)
    actuators: KeySet = field(default_factory=KeySet)

    def check(self, event: Event) -> str | None:
        """Why ``event`` must not be believed, or None (a valid signature, or a type that
        needs none)."""
        spec = BY_NAME.get(event.type)
        signer = spec.signed_by if spec is not None else None
        if signer is None:
            return None
        if signer is Signer.DECIDE:
            return verify(self.decide, event)
        return verify_event(self.actuators, event)


def freshness(cmd: Command, now_us: int, *, max_age_s: float,
              max_skew_s: float = 5.0) -> str | None:
    """Why this command is too old (or from the future) to act on, or None."""
    age_s = (now_us - cmd.issued_at) / 1e6
    if age_s > max_age_s:
        return f"stale: issued {age_s:.1f} s ago (max {max_age_s:.0f} s)"
    if age_s < -max_skew_s:
        return f"issued_at: {-age_s:.1f} s in the future (max skew {max_skew_s:.0f} s)"
    return None


def check(keys: KeySet, event: Event, now_us: int, *, max_age_s: float,
          max_skew_s: float = 5.0) -> str | None:
    """Signature, then freshness. The idempotency key (replays) is the ledger's business."""
    bad = verify(keys, event)
    if bad is not None or not isinstance(event.payload, Command):
        return bad
    return freshness(event.payload, now_us, max_age_s=max_age_s, max_skew_s=max_skew_s)


# --- loading keys -----------------------------------------------------------------------------


def _lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines()
            if ln.strip() and not ln.strip().startswith("#")]


def parse_private(text: str, source: str) -> PrivateKey:
    if "-----BEGIN" in text:
        try:
            key = serialization.load_pem_private_key(text.encode(), password=None)
        except (ValueError, TypeError) as exc:
            raise SigningKeyError(f"{source}: not a PEM private key ({exc})") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise SigningKeyError(f"{source}: not an Ed25519 key ({type(key).__name__})")
        return PrivateKey.of(key)
    lines = _lines(text)
    if len(lines) != 1 or not _HEX32.fullmatch(lines[0]):
        raise SigningKeyError(f"{source}: an Ed25519 private key is 64 hex digits on one line "
                              f"or PEM (make one with `trainguard keys gen DIR`)")
    return PrivateKey.of(Ed25519PrivateKey.from_private_bytes(bytes.fromhex(lines[0])))


def parse_public(text: str, source: str) -> KeySet:
    keys: list[Ed25519PublicKey] = []
    blocks = re.findall(r"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----", text, re.S)
    for block in blocks:
        try:
            key = serialization.load_pem_public_key(block.encode())
        except ValueError as exc:
            raise SigningKeyError(f"{source}: not a PEM public key ({exc})") from None
        if not isinstance(key, Ed25519PublicKey):
            raise SigningKeyError(f"{source}: not an Ed25519 key ({type(key).__name__})")
        keys.append(key)
    rest = re.sub(r"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----", "", text,
                  flags=re.S)
    for n, line in enumerate(_lines(rest), 1):
        if not _HEX32.fullmatch(line):
            raise SigningKeyError(f"{source}: key {n}: an Ed25519 public key is 64 hex digits "
                                  f"on one line or PEM (got {line[:20]!a})")
        keys.append(Ed25519PublicKey.from_public_bytes(bytes.fromhex(line)))
    if not keys:
        raise SigningKeyError(f"{source}: no public key in it")
    return KeySet.of(PublicKey.of(k) for k in keys)


def _text(env: Mapping[str, str], key_file: Path | None, env_file: str,
          env_value: str, what: str) -> tuple[str, str]:
    path = key_file or (Path(env[env_file]) if env.get(env_file) else None)
    if path is not None:
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise SigningKeyError(f"{what}: cannot read {path}: {exc.strerror}") from None
        try:
            return raw.decode("ascii"), str(path)
        except UnicodeDecodeError:
            raise SigningKeyError(f"{what}: {path} is not a text key file") from None
    if env.get(env_value):
        return env[env_value], env_value
    raise SigningKeyError(f"no {what}: set {env_file} (a secret file) or {env_value}")


def load_key(env: Mapping[str, str] | None = None, key_file: Path | None = None) -> PrivateKey:
    """``decide``'s command signing key."""
    env = os.environ if env is None else env
    text, source = _text(env, key_file, ENV_KEY_FILE, ENV_KEY, "command signing key")
    return parse_private(text, source)


def load_command_pubkey(env: Mapping[str, str] | None = None,
                        key_file: Path | None = None) -> KeySet:
    """The actuators' copy of ``decide``'s public key (one or more, for a rotation)."""
    env = os.environ if env is None else env
    text, source = _text(env, key_file, ENV_PUB_FILE, ENV_PUB, "command public key")
    return parse_public(text, source)


def load_actuator_key(env: Mapping[str, str] | None = None,
                      key_file: Path | None = None) -> PrivateKey:
    """An actuator's own key, for its outcomes and pool events."""
    env = os.environ if env is None else env
    text, source = _text(env, key_file, ENV_ACTUATOR_KEY_FILE, ENV_ACTUATOR_KEY,
                         "actuator signing key")
    return parse_private(text, source)


def has_command_pubkey(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get(ENV_PUB_FILE) or env.get(ENV_PUB))


def has_actuator_pubkeys(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get(ENV_ACTUATOR_PUBS_FILE) or env.get(ENV_ACTUATOR_PUBS))


def load_actuator_pubkeys(env: Mapping[str, str] | None = None,
                          key_file: Path | None = None) -> KeySet:
    """The trusted actuator public keys (decide, the rules, incidents, actuators)."""
    env = os.environ if env is None else env
    text, source = _text(env, key_file, ENV_ACTUATOR_PUBS_FILE, ENV_ACTUATOR_PUBS,
                         "trusted actuator public keys")
    return parse_public(text, source)


# --- a key set for a deployment -----------------------------------------------------------------

COMMAND_KEY = "command.key"
COMMAND_PUB = "command.pub"
ACTUATOR_KEY = "actuator.key"
ACTUATOR_PUBS = "actuators.pub"


def _write(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def generate(directory: Path) -> dict[str, Path]:
    """A fresh key set in ``directory`` (refuses to overwrite): ``command.key`` (decide's,
    0600), ``command.pub`` (the actuators'), ``actuator.key`` (an actuator's, 0600) and
    ``actuators.pub`` (the trusted actuator keys: append one line per further actuator)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in (COMMAND_KEY, COMMAND_PUB, ACTUATOR_KEY,
                                                  ACTUATOR_PUBS)}
    there = [str(p) for p in paths.values() if p.exists()]
    if there:
        raise SigningKeyError(f"{there[0]} exists (not overwritten)")
    cmd, act = PrivateKey.generate(), PrivateKey.generate()
    _write(paths[COMMAND_KEY], f"# decide's command signing key (secret)\n{cmd.hex()}\n",
           0o600)
    _write(paths[COMMAND_PUB], f"# decide's public key {cmd.key_id}\n{cmd.public().hex()}\n",
           0o644)
    _write(paths[ACTUATOR_KEY], f"# an actuator's signing key (secret)\n{act.hex()}\n", 0o600)
    _write(paths[ACTUATOR_PUBS], f"# trusted actuator keys\n# {act.key_id}\n"
           f"{act.public().hex()}\n", 0o644)
    return paths


def render_trust_table(prefix: str = "tg") -> str:
    """docs/security.md's generated table: every topic of the registry, the event types on
    it and who signs each (``tests/unit/test_security_doc.py`` keeps the doc current)."""
    from trainguard.events.registry import EVENT_TYPES
    from trainguard.events.topics import TOPIC_SPECS, TopicNames

    names = TopicNames(prefix)
    rows = ["| topic | event types | signed by |", "|---|---|---|"]
    for spec in TOPIC_SPECS:
        types = [t for t in EVENT_TYPES if spec.role in t.topics]
        copies = " (copies)" if types and all(t.topic is not spec.role for t in types) else ""
        listed = (", ".join(f"`{t.name}`" for t in types) + copies
                  or "dead letters (not events)")
        signers = sorted({t.signed_by.value for t in types if t.signed_by is not None})
        signed = ", ".join(
            f"{s}: " + ", ".join(f"`{t.name}`" for t in types
                                 if t.signed_by is not None and t.signed_by.value == s)
            for s in signers) or "nothing"
        rows.append(f"| `{names.name(spec.role)}` | {listed} | {signed} |")
    return "\n".join(rows)
