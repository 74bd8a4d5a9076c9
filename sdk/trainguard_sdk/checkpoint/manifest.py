"""A checkpoint's manifest: which files make it, with their checksum and size, and the
progress it holds. JSON, written last (atomically): a checkpoint directory without a valid
manifest was never committed. The manifest checks itself too (``manifest_sha256``, over the
canonical JSON of the other fields), so a flipped bit in it is found like one in a data file.
Torch-free.

    {"format": 1, "job_id": "J", "step": 120, "samples_consumed": 7680, "world_size": 2,
     "created_at": <µs since the epoch>,
     "files": {"state.pt": {"sha256": "...", "size": 1234}, "rank-00000.json": {...}, ...},
     "manifest_sha256": "..."}

Format 1 is the ``state.pt`` layout (``torch.save`` by rank 0). Format 2 adds ``"layout"``:
``"dcp"`` (``torch.distributed.checkpoint``: one ``__<rank>_<n>.distcp`` shard per writing
rank and DCP's ``.metadata``, each with its checksum) or ``"state_pt"``. A ``state_pt``
manifest is written as format 1, so readers from before format 2 still read it. Format 3
lets a file's checksum be another algorithm than SHA-256 (``checksum.py``): the entry names
it by its key, ``{"crc32": "1a2b3c4d", "size": 1234}`` (exactly one checksum key per file);
manifests whose files all have SHA-256 are still written as format 1 or 2. The manifest's
own ``manifest_sha256`` is SHA-256 in every format.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from trainguard_sdk.checkpoint import checksum
from trainguard_sdk.checkpoint.checksum import SHA256

FORMAT: Final = 1  # the state.pt layout, no "layout" field
FORMAT_LAYOUT: Final = 2  # with "layout"
FORMAT_CHECKSUMS: Final = 3  # with "layout"; a file's checksum may be another than sha256
FORMATS: Final = (FORMAT, FORMAT_LAYOUT, FORMAT_CHECKSUMS)
LAYOUT_STATE_PT: Final = "state_pt"
LAYOUT_DCP: Final = "dcp"
LAYOUTS: Final = (LAYOUT_STATE_PT, LAYOUT_DCP)
MANIFEST_NAME: Final = "MANIFEST.json"
# A plain name in the checkpoint's directory: no separator, no leading dot (temp files have
# one) except DCP's own ".metadata".
FILE_NAME_PATTERN: Final = r"^(?:[A-Za-z0-9_][A-Za-z0-9._-]{0,127}|\.metadata)$"
_FILE_RE: Final = re.compile(FILE_NAME_PATTERN)


class ManifestError(ValueError):
    """A manifest that cannot be trusted; ``field`` names the first bad field."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name


@dataclass(frozen=True)
class FileEntry:
    digest: str  # hex, of ``algorithm``
    size: int
    algorithm: str = SHA256


@dataclass(frozen=True)
class Manifest:
    job_id: str
    step: int
    samples_consumed: int
    world_size: int
    created_at: int
    files: Mapping[str, FileEntry] = field(default_factory=dict)
    format: int = FORMAT
    layout: str = LAYOUT_STATE_PT

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ManifestError("layout", f"one of {LAYOUTS}, got {self.layout!r}")
        if any(e.algorithm != SHA256 for e in self.files.values()):
            object.__setattr__(self, "format", max(self.format, FORMAT_CHECKSUMS))
        elif self.layout != LAYOUT_STATE_PT and self.format == FORMAT:
            object.__setattr__(self, "format", FORMAT_LAYOUT)  # format 1 has no layout field

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.files.values())


def _body(m: Manifest) -> dict[str, Any]:
    body: dict[str, Any] = {
        "format": m.format, "job_id": m.job_id, "step": m.step,
        "samples_consumed": m.samples_consumed, "world_size": m.world_size,
        "created_at": m.created_at,
        "files": {name: {e.algorithm: e.digest, "size": e.size}
                  for name, e in sorted(m.files.items())}}
    if m.format != FORMAT:
        body["layout"] = m.layout
    return body


def _canonical(body: Mapping[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode(m: Manifest) -> bytes:
    """The manifest's bytes (pretty, one trailing newline). ValueError for a bad file name or
    digest: a manifest that could not be read back is never written."""
    for name, entry in m.files.items():
        if not _FILE_RE.fullmatch(name) or name == MANIFEST_NAME:
            raise ManifestError(f"files.{name}", f"a plain file name matching {FILE_NAME_PATTERN}")
        if entry.algorithm not in checksum.ALGORITHMS:
            raise ManifestError(f"files.{name}", f"checksum one of {checksum.ALGORITHMS}, "
                                                 f"got {entry.algorithm!r}")
        if not checksum.valid_digest(entry.algorithm, entry.digest):
            raise ManifestError(f"files.{name}.{entry.algorithm}", _DIGEST_SHAPE[entry.algorithm])
    body = _body(m)
    out = {**body, "manifest_sha256": hashlib.sha256(_canonical(body)).hexdigest()}
    return (json.dumps(out, indent=1, sort_keys=True) + "\n").encode()


def decode(data: bytes) -> Manifest:
    """Parse and check a manifest; ``ManifestError`` naming the first bad field."""
    try:
        raw = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestError("manifest", f"not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ManifestError("manifest", "not a JSON object")
    claimed = raw.pop("manifest_sha256", None)
    if not isinstance(claimed, str):
        raise ManifestError("manifest_sha256", "missing")
    if hashlib.sha256(_canonical(raw)).hexdigest() != claimed:
        raise ManifestError("manifest_sha256", "does not match the manifest's content")
    fmt = _int(raw, "format")
    if fmt not in FORMATS:
        raise ManifestError("format", f"{fmt} is not a format this reader knows {FORMATS}")
    layout = raw.get("layout") if fmt != FORMAT else LAYOUT_STATE_PT
    if layout not in LAYOUTS:
        raise ManifestError("layout", f"one of {LAYOUTS}, got {layout!r}")
    job_id = raw.get("job_id")
    if not isinstance(job_id, str) or not job_id:
        raise ManifestError("job_id", "a non-empty string")
    files = raw.get("files")
    if not isinstance(files, dict) or not files:
        raise ManifestError("files", "a non-empty object")
    entries: dict[str, FileEntry] = {}
    for name, entry in files.items():
        if not isinstance(name, str) or not _FILE_RE.fullmatch(name) or name == MANIFEST_NAME:
            raise ManifestError(f"files.{name}", "not a plain file name")
        if not isinstance(entry, dict):
            raise ManifestError(f"files.{name}", "not an object")
        algorithm = _algorithm(entry, fmt, f"files.{name}")
        digest = entry.get(algorithm)
        if not isinstance(digest, str) or not checksum.valid_digest(algorithm, digest):
            raise ManifestError(f"files.{name}.{algorithm}", _DIGEST_SHAPE[algorithm])
        entries[name] = FileEntry(digest, _int(entry, "size", f"files.{name}."), algorithm)
    return Manifest(job_id=job_id, step=_int(raw, "step"),
                    samples_consumed=_int(raw, "samples_consumed"),
                    world_size=_int(raw, "world_size", minimum=1),
                    created_at=_int(raw, "created_at"), files=entries, format=fmt,
                    layout=layout)


_DIGEST_SHAPE: Final = {checksum.SHA256: "64 lowercase hex digits",
                        checksum.CRC32: "8 lowercase hex digits"}


def _algorithm(entry: Mapping[str, Any], fmt: int, where: str) -> str:
    """The checksum a file entry carries: sha256 before format 3; from format 3 exactly one
    of the known algorithms' keys."""
    if fmt < FORMAT_CHECKSUMS:
        return SHA256
    present = [a for a in checksum.ALGORITHMS if a in entry]
    if len(present) != 1:
        raise ManifestError(where, f"exactly one checksum of {checksum.ALGORITHMS}, "
                                   f"got {sorted(present) or 'none'}")
    return present[0]


def _int(obj: Mapping[str, Any], key: str, prefix: str = "", minimum: int = 0) -> int:
    value = obj.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ManifestError(f"{prefix}{key}", f"an int >= {minimum}, got {value!r}")
    return value
