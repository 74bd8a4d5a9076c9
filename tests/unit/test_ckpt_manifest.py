"""The manifest: exact round trips, a self-checksum that catches any flipped bit, and
errors that name the bad field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from trainguard_sdk.checkpoint import manifest as mf

NAMES = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,20}", fullmatch=True).filter(
    lambda n: n != mf.MANIFEST_NAME)
ENTRIES = st.one_of(
    st.builds(mf.FileEntry, digest=st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
              size=st.integers(0, 2**50)),
    st.builds(mf.FileEntry, digest=st.from_regex(r"[0-9a-f]{8}", fullmatch=True),
              size=st.integers(0, 2**50), algorithm=st.just("crc32")))
MANIFESTS = st.builds(
    mf.Manifest, job_id=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,30}", fullmatch=True),
    step=st.integers(0, 2**40), samples_consumed=st.integers(0, 2**50),
    world_size=st.integers(1, 4096), created_at=st.integers(0, 2**53 - 1),
    files=st.dictionaries(NAMES, ENTRIES, min_size=1, max_size=6))


@settings(max_examples=200, deadline=None)
@given(MANIFESTS)
def test_round_trip_is_exact(m: mf.Manifest) -> None:
    assert mf.decode(mf.encode(m)) == m


@settings(max_examples=200, deadline=None)
@given(MANIFESTS, st.data())
def test_any_flipped_bit_is_refused(m: mf.Manifest, data: st.DataObject) -> None:
    raw = bytearray(mf.encode(m))
    i = data.draw(st.integers(0, len(raw) - 1))
    bit = data.draw(st.integers(0, 7))
    raw[i] ^= 1 << bit
    try:
        got = mf.decode(bytes(raw))
    except mf.ManifestError:
        return
    # a flip inside JSON whitespace/indentation can leave the same document: then it is equal
    assert got == m


def _doc(**changes: object) -> bytes:
    m = mf.Manifest("job-1", 4, 128, 2, 1, {"state.pt": mf.FileEntry("a" * 64, 10)})
    body = json.loads(mf.encode(m))
    body.pop("manifest_sha256")
    body.update(changes)
    import hashlib

    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    body["manifest_sha256"] = hashlib.sha256(canon).hexdigest()
    return json.dumps(body).encode()


@pytest.mark.parametrize(("changes", "field"), [
    ({"format": 4}, "format"),
    ({"format": 3}, "layout"),
    ({"format": 3, "layout": "dcp", "files": {"s": {"crc32": "0" * 8, "sha256": "a" * 64,
                                                     "size": 1}}}, "files.s"),
    ({"format": 3, "layout": "dcp", "files": {"s": {"md5": "0" * 32, "size": 1}}}, "files.s"),
    ({"format": 3, "layout": "dcp", "files": {"s": {"crc32": "0" * 64, "size": 1}}},
     "files.s.crc32"),
    ({"format": 2, "layout": "dcp", "files": {"s": {"crc32": "0" * 8, "size": 1}}},
     "files.s.sha256"),
    ({"format": 2}, "layout"),
    ({"format": 2, "layout": "zip"}, "layout"),
    ({"step": -1}, "step"),
    ({"world_size": 0}, "world_size"),
    ({"samples_consumed": "7"}, "samples_consumed"),
    ({"files": {}}, "files"),
    ({"files": {"../x": {"sha256": "a" * 64, "size": 1}}}, "files.../x"),
    ({"files": {"s": {"sha256": "A" * 64, "size": 1}}}, "files.s.sha256"),
    ({"files": {"s": {"sha256": "a" * 64, "size": -3}}}, "files.s.size"),
    ({"job_id": ""}, "job_id"),
])
def test_bad_fields_are_named(changes: dict[str, object], field: str) -> None:
    with pytest.raises(mf.ManifestError) as info:
        mf.decode(_doc(**changes))
    assert info.value.field == field


def test_a_dcp_manifest_round_trips_with_its_layout_and_metadata_file() -> None:
    m = mf.Manifest("job-1", 4, 128, 2, 1, {"__0_0.distcp": mf.FileEntry("a" * 64, 10),
                                            ".metadata": mf.FileEntry("b" * 64, 3)},
                    layout=mf.LAYOUT_DCP)
    assert m.format == mf.FORMAT_LAYOUT
    raw = mf.encode(m)
    assert json.loads(raw)["layout"] == "dcp"
    assert mf.decode(raw) == m
    legacy = mf.encode(mf.Manifest("job-1", 4, 128, 2, 1, {"state.pt": mf.FileEntry("a" * 64, 1)}))
    assert "layout" not in json.loads(legacy) and json.loads(legacy)["format"] == 1


def test_tampered_content_fails_the_self_checksum() -> None:
    raw = mf.encode(mf.Manifest("job-1", 4, 128, 2, 1, {"state.pt": mf.FileEntry("a" * 64, 10)}))
    tampered = raw.replace(b'"step": 4', b'"step": 5')
    assert tampered != raw
    with pytest.raises(mf.ManifestError) as info:
        mf.decode(tampered)
    assert info.value.field == "manifest_sha256"
    with pytest.raises(mf.ManifestError) as info:
        mf.decode(raw[: len(raw) // 2])
    assert info.value.field == "manifest"


def test_encode_refuses_unsafe_names() -> None:
    for name in ("../escape", "a/b", ".hidden", ".metadata.tmp", "..", mf.MANIFEST_NAME, ""):
        with pytest.raises(mf.ManifestError):
            mf.encode(mf.Manifest("j", 1, 1, 1, 1, {name: mf.FileEntry("a" * 64, 1)}))


def test_a_crc32_manifest_says_so_and_sha256_ones_keep_their_format() -> None:
    m = mf.Manifest("job-1", 4, 128, 2, 1, {"__0_0.distcp": mf.FileEntry("0a1b2c3d", 10, "crc32"),
                                            ".metadata": mf.FileEntry("b" * 64, 3)},
                    layout=mf.LAYOUT_DCP)
    assert m.format == mf.FORMAT_CHECKSUMS
    body = json.loads(mf.encode(m))
    assert body["format"] == 3 and body["files"]["__0_0.distcp"] == {"crc32": "0a1b2c3d",
                                                                     "size": 10}
    assert body["files"][".metadata"] == {"sha256": "b" * 64, "size": 3}
    assert mf.decode(mf.encode(m)) == m
    crc_state_pt = mf.Manifest("j", 1, 1, 1, 1, {"state.pt": mf.FileEntry("0" * 8, 1, "crc32")})
    assert json.loads(mf.encode(crc_state_pt))["layout"] == "state_pt"
    with pytest.raises(mf.ManifestError) as info:
        mf.encode(mf.Manifest("j", 1, 1, 1, 1, {"s": mf.FileEntry("0" * 8, 1, "md5")}))
    assert info.value.field == "files.s"
