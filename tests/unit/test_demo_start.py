"""The demo's start-up watch: a bound rank that is gone ends the wait with its own error line."""

from __future__ import annotations

from pathlib import Path

from trainguard.demo.whole_loop import JOB, last_line, start_failure
from trainguard.events.codec import make_event
from trainguard.events.envelope import Event, Subject
from trainguard.events.payloads import PoolUnit, UnitState


def _bound(rank: int, pid: int, epoch: int = 1) -> Event:
    return make_event(PoolUnit(unit=f"u{rank}", state=UnitState.BOUND, rank=rank, epoch=epoch,
                               pid=pid), event_id=f"event-{rank}-{pid}-{epoch}", job_id=JOB,
                      event_time=1_000 + rank, source="actuator",
                      subject=Subject(unit=f"u{rank}", rank=rank))


def test_every_bound_rank_running_is_no_failure(tmp_path: Path) -> None:
    events = [_bound(r, 100 + r) for r in range(4)]
    assert start_failure(events, tmp_path, alive=lambda _pid: True) is None
    assert start_failure([], tmp_path, alive=lambda _pid: False) is None  # nothing bound yet


def test_a_rank_gone_names_itself_and_its_last_log_line(tmp_path: Path) -> None:
    (tmp_path / f"{JOB}-rank2-e1.log").write_text(
        "INFO starting\nrank 2: --ckpt-dir '/tmp/x' is under /tmp, which does not survive "
        "the node; give a durable directory, or set --allow-tmp-ckpt\n\n")
    events = [_bound(r, 100 + r) for r in range(4)]
    why = start_failure(events, tmp_path, alive=lambda pid: pid != 102)
    assert why == ("rank 2 (pid 102) exited before the job started: rank 2: --ckpt-dir '/tmp/x' "
                   "is under /tmp, which does not survive the node; give a durable directory, "
                   "or set --allow-tmp-ckpt")


def test_the_newest_binding_of_a_rank_is_the_one_watched(tmp_path: Path) -> None:
    events = [_bound(1, 101), _bound(1, 201, epoch=2)]
    assert start_failure(events, tmp_path, alive=lambda pid: pid == 201) is None
    why = start_failure(events, tmp_path, alive=lambda pid: pid == 101)
    assert why is not None and "pid 201" in why and "no log" in why


def test_last_line_of_an_empty_log(tmp_path: Path) -> None:
    (tmp_path / "x.log").write_text("\n  \n")
    assert last_line(tmp_path / "x.log").startswith("(nothing in")
