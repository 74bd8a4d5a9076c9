"""The checkpoint store: commit by manifest, verification outcomes (truncation, a flipped
bit, a missing file, no manifest), keep-K, quarantine. Torch-free."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard_sdk.checkpoint import manifest as mf
from trainguard_sdk.checkpoint.atomic import atomic_write_bytes
from trainguard_sdk.checkpoint.store import CheckpointStore, CorruptFile, Invalid, Valid


def _save(store: CheckpointStore, step: int, payload: bytes = b"x" * 1000) -> Valid:
    d = store.step_dir(step)
    d.mkdir()
    files = {}
    for name, data in (("state.pt", payload + bytes([step % 256])),
                       ("rank-00000.json", b'{"step": %d}' % step)):
        w = atomic_write_bytes(d / name, data)
        files[name] = mf.FileEntry(w.digest, w.size)
    return store.commit(mf.Manifest("job-1", step, step * 64, 1, 1, files))


def test_commit_then_verify(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    valid = _save(store, 7)
    got = store.verify(store.step_dir(7))
    assert isinstance(got, Valid)
    assert got.manifest == valid.manifest and got.manifest_sha256 == valid.manifest_sha256
    assert store.read_verified(got, "rank-00000.json") == b'{"step": 7}'
    assert store.steps() == [(7, store.step_dir(7))]


@pytest.mark.parametrize("damage", ["truncate", "bitflip", "missing", "manifest-bitflip",
                                    "no-manifest", "wrong-dir"])
def test_damage_is_found_with_a_reason(tmp_path: Path, damage: str) -> None:
    store = CheckpointStore(tmp_path)
    _save(store, 3)
    d = store.step_dir(3)
    state = d / "state.pt"
    if damage == "truncate":
        state.write_bytes(state.read_bytes()[:500])
    elif damage == "bitflip":
        raw = bytearray(state.read_bytes())
        raw[123] ^= 0x10
        state.write_bytes(bytes(raw))
    elif damage == "missing":
        state.unlink()
    elif damage == "manifest-bitflip":
        raw = bytearray((d / mf.MANIFEST_NAME).read_bytes())
        raw[40] ^= 0x01
        (d / mf.MANIFEST_NAME).write_bytes(bytes(raw))
    elif damage == "no-manifest":
        (d / mf.MANIFEST_NAME).unlink()
    else:
        d.rename(store.step_dir(4))
        d = store.step_dir(4)
    got = store.verify(d)
    assert isinstance(got, Invalid)
    expected = {"truncate": "state.pt: 500 bytes, the manifest says 1001",
                "bitflip": "state.pt: sha256 does not match",
                "missing": "state.pt: missing",
                "manifest-bitflip": "MANIFEST.json: ",
                "no-manifest": "no MANIFEST.json",
                "wrong-dir": "step 3 in a directory named for step 4"}[damage]
    assert expected in got.reason
    assert got.committed == (damage != "no-manifest")


def test_read_verified_catches_a_change_after_verification(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    valid = _save(store, 1)
    (valid.path / "state.pt").write_bytes(b"y" * 1001)  # same size, other bytes
    with pytest.raises(CorruptFile, match="sha256"):
        store.read_verified(valid, "state.pt")
    with pytest.raises(CorruptFile, match="not in the manifest"):
        store.read_verified(valid, "other")


def test_keep_k_removes_older_committed_and_stale_uncommitted(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for step in (2, 4, 6, 8):
        _save(store, step)
    store.step_dir(5).mkdir()  # a save that never finished, older than the newest
    store.step_dir(10).mkdir()  # a save in flight: newer than the newest committed
    removed = store.prune(keep=2, newest_committed=8)
    assert sorted(p.name for p in removed) == [
        "step-000000000002", "step-000000000004", "step-000000000005"]
    assert [s for s, _ in store.steps()] == [6, 8, 10]
    for step in (6, 8):
        assert isinstance(store.verify(store.step_dir(step)), Valid)


def test_quarantine_moves_aside_and_bounds_the_pile(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for step in (1, 2, 3):
        _save(store, step)
        store.quarantine(store.step_dir(step), keep=2)
    assert store.steps() == []
    kept = sorted(p.name.rsplit("-", 1)[0] for p in (tmp_path / "quarantine").iterdir())
    assert kept == ["step-000000000002", "step-000000000003"]
    assert store.quarantine(store.step_dir(9), keep=2) is None


def test_the_step_hook_and_the_torch_free_modules_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, trainguard_sdk, trainguard_sdk.checkpoint.store, "
            "trainguard_sdk.checkpoint.rng, trainguard_sdk.checkpoint.collective, "
            "trainguard_sdk.checkpoint.location; "
            "sys.exit(3 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
