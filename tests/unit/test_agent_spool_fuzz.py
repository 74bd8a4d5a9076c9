"""The spool journal against damaged bytes: single-byte corruptions, truncations, old format.

Opening a damaged journal never raises; every record whose own entry is intact comes back
byte for byte; a record whose settlement may have been lost comes back *uncertain* (the
publisher checks the topic before sending it again), never silently resent."""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard.agent.spool import MAGIC, DiskSpool, Spooled, frame, recover, scan

TYPES = ["telemetry.node", "heartbeat", "step.report", "process.exit"]


@dataclass(frozen=True)
class Journal:
    data: bytes
    records: dict[int, Spooled]  # every record ever put, by seq
    put_span: dict[int, tuple[int, int]]  # seq -> byte range of its PUT entry
    live: frozenset[int]  # records not settled at the end
    sent: frozenset[int]  # live records handed to the producer


def _build(tmp: Path) -> Journal:
    """A journal of 40 records with sends and settlements mixed in, and where each entry is."""
    spool = DiskSpool(tmp / "build", max_bytes=10**9)
    path = tmp / "build" / "journal.bin"
    records: dict[int, Spooled] = {}
    sent: set[int] = set()
    spans: dict[int, tuple[int, int]] = {}
    for i in range(40):
        start = path.stat().st_size
        rec = spool.put(f"tg.{TYPES[i % 4]}", f"job-{i % 3}".encode(),
                        bytes(range(i % 7, i % 7 + 30 + i)), TYPES[i % 4], 1_700_000_000_000 + i)
        records[rec.seq] = rec
        spans[rec.seq] = (start, path.stat().st_size)
        if i % 5 == 4:
            spool.sent([i - 4, i - 3, i - 2])
            sent.update([i - 4, i - 3, i - 2])
        if i % 10 == 9:
            spool.done([i - 9, i - 8, i - 7])
    live = frozenset(r.seq for r in spool.head(10**6))
    spool.close()
    return Journal(path.read_bytes(), records, spans, live, frozenset(sent & live))


def _open(tmp: Path, data: bytes) -> DiskSpool:
    d = tmp / "open"  # reused, not removed: removing files is slow on some filesystems
    d.mkdir(exist_ok=True)
    (d / "journal.bin").write_bytes(data)
    return DiskSpool(d, max_bytes=10**9)


def _check_corrupted(j: Journal, live: list[Spooled], uncertain: frozenset[int],
                     pos: int) -> None:
    got = {r.seq: r for r in live}
    for seq in j.live:  # every live record whose own entry is untouched comes back exactly
        lo, hi = j.put_span[seq]
        if not lo <= pos < hi:
            assert got.get(seq) == j.records[seq], (pos, seq)
    for seq, rec in got.items():  # nothing made up, nothing settled resent without a check
        assert rec == j.records[seq], (pos, seq)
        if seq not in j.live or seq in j.sent:
            assert seq in uncertain, (pos, seq)


@pytest.fixture(autouse=True)
def _no_fsync(monkeypatch: pytest.MonkeyPatch) -> None:
    """Durability against power loss is not what these tests check; thousands of fsyncs are slow."""
    monkeypatch.setattr("trainguard.agent.spool.os.fsync", lambda _fd: None)


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    return _build(tmp_path_factory.mktemp("journal"))


def test_an_intact_journal_reopens_exactly(journal: Journal, tmp_path: Path) -> None:
    spool = _open(tmp_path, journal.data)
    assert {r.seq: r for r in spool.head(10**6)} == {s: journal.records[s] for s in journal.live}
    assert spool.uncertain_at_open == journal.sent and spool.corrupt_entries == 0


def _flips(j: Journal, n: int, seed: int) -> list[tuple[int, bytes]]:
    """``n`` single-byte corruptions: every position once, then random ones."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        pos = i if i < len(j.data) else rng.randrange(len(j.data))
        data = bytearray(j.data)
        data[pos] ^= rng.randrange(1, 256)
        out.append((pos, bytes(data)))
    return out


def test_3000_single_byte_corruptions_never_crash_and_lose_only_the_hit_record(
        journal: Journal) -> None:
    noticed = 0
    for pos, data in _flips(journal, 3000, seed=11):
        got = recover(data)  # what opening the spool replays
        _check_corrupted(journal, list(got.live.values()), got.uncertain, pos)
        noticed += got.corrupt_entries > 0
    assert noticed == 3000  # every flip was noticed: the checksum covers every byte


def test_corrupted_journals_open_count_and_are_rewritten_clean(journal: Journal,
                                                              tmp_path: Path) -> None:
    for pos, data in _flips(journal, 150, seed=12)[::1]:
        spool = _open(tmp_path, data)
        live = spool.head(10**6)
        _check_corrupted(journal, live, spool.uncertain_at_open, pos)
        assert spool.corrupt_entries >= 1
        spool.close()
        again = DiskSpool(tmp_path / "open", max_bytes=10**9)
        assert again.corrupt_entries == 0 and again.head(10**6) == live
        assert again.uncertain_at_open == spool.uncertain_at_open
        again.close()


def test_every_truncation_keeps_every_entry_before_the_cut(journal: Journal,
                                                           tmp_path: Path) -> None:
    bounds = {b for span in journal.put_span.values() for b in span}
    cuts = sorted({c for b in bounds for c in (b - 1, b, b + 1) if c >= 0}
                  | set(range(0, len(journal.data), 7))
                  | {len(journal.data)})
    for cut in cuts:
        complete = [s for s, (_lo, hi) in journal.put_span.items() if hi <= cut]
        got = dict(recover(journal.data[:cut]).live)
        for seq in complete:
            if seq in journal.live:
                assert got[seq] == journal.records[seq], (cut, seq)
        assert set(got) <= set(complete), cut


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_any_damage_opens_without_raising(journal: Journal,
                                          data: st.DataObject) -> None:
    raw = bytearray(journal.data)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(raw) - 1))
        action = data.draw(st.sampled_from(["flip", "insert", "delete", "magic"]))
        if action == "flip":
            raw[pos] ^= data.draw(st.integers(1, 255))
        elif action == "insert":
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=20))
        elif action == "delete":
            del raw[pos: pos + data.draw(st.integers(1, 20))]
        else:  # a fake entry start: magic then garbage
            raw[pos:pos] = MAGIC + data.draw(st.binary(max_size=12))
    for rec in recover(bytes(raw)).live.values():  # whatever comes back was put
        assert rec == journal.records[rec.seq]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_open_without_raising(blob: bytes) -> None:
    got = recover(blob)
    assert got.uncertain <= set(got.live)


def test_a_checksummed_entry_with_a_bad_body_is_skipped_not_raised(tmp_path: Path) -> None:
    spool = _open(tmp_path, frame(1, b"\x00" * 5) + frame(2, b"abc"))
    assert len(spool) == 0 and spool.corrupt_entries == 2


def test_the_uncertain_set_survives_a_restart(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path)
    seqs = [spool.put("tg.task", b"k", bytes([i]) * 10, "step.report", i).seq for i in range(6)]
    spool.sent(seqs[:4])
    spool.done(seqs[:2])
    spool.close()
    again = DiskSpool(tmp_path)
    assert again.uncertain_at_open == {seqs[2], seqs[3]}
    for _ in range(2000):  # compaction keeps the marks
        again.done([again.put("tg.task", b"k", b"x" * 1000, "step.report", 0).seq])
    again.close()
    assert DiskSpool(tmp_path).uncertain_at_open == {seqs[2], seqs[3]}


def test_a_first_format_journal_is_read_and_rewritten(tmp_path: Path) -> None:
    head, meta = struct.Struct(">BI"), struct.Struct(">QBQHH")
    old = b""
    for seq in range(3):
        body = meta.pack(seq, 2, 1000 + seq, 7, 3) + b"tg.taskjob" + b"\x0b" + b"step.report"
        body += bytes([seq]) * 20
        old += head.pack(1, len(body)) + body
    old += head.pack(2, 8) + struct.pack(">Q", 0)
    spool = _open(tmp_path, old + b"\x01\x00")  # and a torn last write
    assert [r.seq for r in spool.head(10)] == [1, 2] and spool.migrated
    assert spool.head(1)[0].value == bytes([1]) * 20
    assert spool.uncertain_at_open == {1, 2}  # the first format did not record sends
    spool.close()
    entries, skipped = scan((tmp_path / "open" / "journal.bin").read_bytes())
    assert skipped == 0 and [e.kind for e in entries] == [1, 1, 3]
