"""The incident service's snapshot file: the live fold's state (``LiveIncidents.snapshot``) with
the consumer offsets it covers, so a restart reads on from there instead of from earliest.

The file is one header line, then the body, both JSON::

    {"format": "trainguard.incidents.snapshot", "version": 1, "sha256": "<of the body>",
     "length": <body bytes>}
    {"identity": {...}, "offsets": [[topic, partition, offset], ...], "state": {...}}

``identity`` says which log and which fold it is (topic prefix, consumer group, settings): a
snapshot of another is not used. It is written whole to a temporary file, fsync'd, renamed over
the old one, and the directory fsync'd: a crash leaves the old snapshot or the new one, never a
mix. Reading it back checks the format, the version, the length and the checksum; whatever
fails is ``SnapshotError`` with one line saying what (the service logs it and rebuilds).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from trainguard.incidents.state_codec import SnapshotError

FORMAT = "trainguard.incidents.snapshot"
VERSION = 1
FILE_NAME = "incidents.snapshot"

Offsets = dict[tuple[str, int], int]


@dataclass(frozen=True)
class Snapshot:
    identity: dict[str, Any]
    offsets: Offsets  # (topic, partition) -> the next offset to read
    state: dict[str, Any]  # LiveIncidents.snapshot()


def encode_snapshot(snap: Snapshot) -> bytes:
    body = orjson.dumps({"identity": snap.identity,
                         "offsets": [[t, p, o] for (t, p), o in sorted(snap.offsets.items())],
                         "state": snap.state})
    header = orjson.dumps({"format": FORMAT, "version": VERSION,
                           "sha256": hashlib.sha256(body).hexdigest(), "length": len(body)})
    return header + b"\n" + body


def decode_snapshot(data: bytes) -> Snapshot:
    head, sep, body = data.partition(b"\n")
    if not sep:
        raise SnapshotError("no header line")
    try:
        header = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise SnapshotError(f"header: not JSON ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise SnapshotError(f"header.format: not {FORMAT!r}")
    if header.get("version") != VERSION:
        raise SnapshotError(f"header.version: {header.get('version')!r}, this reader knows "
                            f"{VERSION}")
    if header.get("length") != len(body):
        raise SnapshotError(f"header.length: {header.get('length')!r}, the body has "
                            f"{len(body)} bytes (truncated?)")
    digest = hashlib.sha256(body).hexdigest()
    if header.get("sha256") != digest:
        raise SnapshotError(f"header.sha256: {header.get('sha256')!r} does not match the "
                            f"body's {digest}")
    try:
        doc = orjson.loads(body)
        offsets = {(str(t), int(p)): int(o) for t, p, o in doc["offsets"]}
        identity, state = doc["identity"], doc["state"]
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise SnapshotError(f"body: {type(exc).__name__}: {exc}") from None
    if not isinstance(identity, dict) or not isinstance(state, dict):
        raise SnapshotError("body: identity and state are JSON objects")
    return Snapshot(identity, offsets, state)


def identity_problem(got: Mapping[str, Any], want: Mapping[str, Any]) -> str | None:
    """Why a snapshot of ``got`` is not one of ``want`` (None: it is)."""
    for key in sorted(set(got) | set(want)):
        if got.get(key) != want.get(key):
            return f"identity.{key}: {got.get(key)!r} in the snapshot, {want.get(key)!r} here"
    return None


class SnapshotStore:
    """The snapshot file in ``directory`` (created when first written)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / FILE_NAME

    def write(self, data: bytes) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{FILE_NAME}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self) -> Snapshot | None:
        """The snapshot, or None when there is none; ``SnapshotError`` when it is unreadable
        or corrupt."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SnapshotError(f"unreadable: {exc.strerror or exc}") from None
        return decode_snapshot(data)
