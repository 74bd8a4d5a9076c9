from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from trainguard.agent.spool import DiskSpool, Priority, priority_of

TYPES = ["telemetry.node", "heartbeat", "step.report", "process.exit"]


def _put(spool: DiskSpool, i: int, event_type: str, size: int = 100) -> int:
    return spool.put("tg.task", b"job", bytes([i % 256]) * size, event_type, i).seq


def test_records_survive_a_reopen_in_order(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path)
    seqs = [_put(spool, i, TYPES[i % 4]) for i in range(10)]
    spool.done(seqs[:3])
    spool.close()
    again = DiskSpool(tmp_path)
    assert [r.seq for r in again.head(100)] == seqs[3:]
    assert [r.event_type for r in again.head(100)] == [TYPES[i % 4] for i in range(3, 10)]
    assert again.head(1)[0].value == bytes([3]) * 100
    assert _put(again, 99, "step.report") == seqs[-1] + 1  # sequence continues


def test_a_torn_last_write_loses_only_that_record(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path)
    for i in range(5):
        _put(spool, i, "step.report")
    spool.close()
    journal = tmp_path / "journal.bin"
    journal.write_bytes(journal.read_bytes()[:-7])
    again = DiskSpool(tmp_path)
    assert [r.seq for r in again.head(10)] == [0, 1, 2, 3]
    _put(again, 5, "step.report")
    again.close()
    assert [r.seq for r in DiskSpool(tmp_path).head(10)] == [0, 1, 2, 3, 4]


def test_budget_drops_telemetry_first_then_heartbeats_never_essential(tmp_path: Path) -> None:
    rec_size = 100 + 3 + len("tg.task")
    spool = DiskSpool(tmp_path, max_bytes=rec_size * 6)
    for i, t in enumerate(["telemetry.node", "step.report", "heartbeat", "telemetry.node",
                           "step.report", "heartbeat"]):
        _put(spool, i, t)
    assert not spool.dropped
    _put(spool, 6, "process.exit")
    _put(spool, 7, "step.report")
    assert spool.dropped == {"telemetry.node": 2}
    _put(spool, 8, "step.report")
    assert spool.dropped == {"telemetry.node": 2, "heartbeat": 1}
    kept = [r.event_type for r in spool.head(100)]
    assert kept.count("step.report") == 4 and "process.exit" in kept
    assert spool.live_bytes <= spool.max_bytes


def test_the_journal_is_compacted_when_settled_records_pile_up(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path)
    for i in range(3000):
        spool.done([_put(spool, i, "step.report", size=1000)])
    keep = _put(spool, 3000, "step.report")
    assert (tmp_path / "journal.bin").stat().st_size < 3 << 20
    spool.close()
    assert [r.seq for r in DiskSpool(tmp_path).head(10)] == [keep]


def test_priorities() -> None:
    assert priority_of("telemetry.node") is Priority.TELEMETRY
    assert priority_of("heartbeat") is Priority.HEARTBEAT
    for t in ("step.report", "process.exit", "node.health", "checkpoint"):
        assert priority_of(t) is Priority.ESSENTIAL


ops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(TYPES)),
    st.tuples(st.just("done"), st.integers(0, 5)),
    st.tuples(st.just("reopen"), st.none()),
), max_size=60)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_spool_matches_a_model_through_any_history(history: list[tuple[str, object]]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        spool = DiskSpool(Path(tmp), max_bytes=10**9)
        model: list[int] = []
        i = 0
        for op, arg in history:
            if op == "put":
                model.append(_put(spool, i, str(arg)))
                i += 1
            elif op == "done":
                n = int(str(arg))
                spool.done(model[:n])
                model = model[n:]
            else:
                spool.close()
                spool = DiskSpool(Path(tmp), max_bytes=10**9)
            assert [r.seq for r in spool.head(10**6)] == model
        spool.close()
