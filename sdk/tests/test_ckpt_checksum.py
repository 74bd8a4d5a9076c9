"""Checksums a manifest may list: crc32 and sha256 digests of the bytes, a running checksum
equal to a one-shot one, an unknown algorithm refused by name; a crc32 checkpoint verifies and
a flipped bit in it is found."""

from __future__ import annotations

import hashlib
import os
import zlib
from pathlib import Path

import pytest

from trainguard_sdk.checkpoint import checksum
from trainguard_sdk.checkpoint import manifest as mf
from trainguard_sdk.checkpoint.atomic import atomic_write_bytes
from trainguard_sdk.checkpoint.store import CheckpointStore, Invalid, Valid


@pytest.mark.parametrize("algorithm", checksum.ALGORITHMS)
def test_running_checksum_and_file_digest_match_the_reference(tmp_path: Path,
                                                              algorithm: str) -> None:
    data = os.urandom(5 << 20) + b"tail"
    want = (f"{zlib.crc32(data):08x}" if algorithm == checksum.CRC32
            else hashlib.sha256(data).hexdigest())
    h = checksum.new(algorithm)
    for i in range(0, len(data), 1 << 20):
        h.update(memoryview(data)[i:i + (1 << 20)])
    assert h.hexdigest() == want and checksum.valid_digest(algorithm, want)
    w = atomic_write_bytes(tmp_path / "f", data, algorithm=algorithm)
    assert (w.digest, w.size, w.algorithm) == (want, len(data), algorithm)
    assert checksum.file_digest(tmp_path / "f", algorithm) == (want, len(data))


def test_unknown_algorithm_is_named() -> None:
    with pytest.raises(ValueError, match=r"checksum: .*'md5'"):
        checksum.new("md5")


def test_a_crc32_checkpoint_verifies_and_a_flipped_bit_is_found(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    d = store.step_dir(3)
    d.mkdir()
    w = atomic_write_bytes(d / "__0_0.distcp", os.urandom(1 << 20), algorithm=checksum.CRC32)
    store.commit(mf.Manifest("j", 3, 9, 1, 1, {w.path.name: mf.FileEntry(w.digest, w.size,
                                                                          w.algorithm)},
                             layout=mf.LAYOUT_DCP))
    ok = store.verify(d)
    assert isinstance(ok, Valid) and ok.manifest.files["__0_0.distcp"].algorithm == "crc32"
    assert store.read_verified(ok, "__0_0.distcp") == w.path.read_bytes()
    raw = bytearray(w.path.read_bytes())
    raw[12345] ^= 0x01
    w.path.write_bytes(raw)
    bad = store.verify(d)
    assert isinstance(bad, Invalid) and bad.reason == "__0_0.distcp: crc32 does not match " \
                                                      "the manifest"
