"""Slurm's CLI output parsed: captured from the real slurm-wlm 22.05 (tests/fixtures/slurm)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.actuators.slurm_view import (
    NodeHealth,
    SlurmParseError,
    expand_hostlist,
    parse_job_state,
    parse_keyvalues,
    parse_scontrol_steps,
    parse_sinfo_json,
    parse_squeue_json,
    pool,
    scheduler_end,
    steps_on,
)
from trainguard.events.payloads import SchedulerEnd

pytestmark = pytest.mark.unit
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def test_nodes_from_sinfo_json() -> None:
    nodes = {n.name: n for n in parse_sinfo_json((FIX / "sinfo_drain.json").read_text())}
    assert sorted(nodes) == ["tgn1", "tgn2", "tgn3", "tgn4"]
    assert nodes["tgn2"].health is NodeHealth.DRAINING
    assert nodes["tgn2"].reason == "tg incident i-123"
    assert nodes["tgn4"].features == ("spare",)
    assert nodes["tgn1"].address == "10.252.0.11"
    assert nodes["tgn3"].health is NodeHealth.USABLE


def test_jobs_from_squeue_json_and_the_pool() -> None:
    jobs = {j.job_id: j for j in parse_squeue_json((FIX / "squeue_running.json").read_text())}
    assert jobs[3].state == "RUNNING" and jobs[3].nodes == ("tgn1", "tgn3")
    nodes = parse_sinfo_json((FIX / "sinfo_drain.json").read_text())
    p = pool(nodes, jobs[3])
    assert [n.name for n in p.allocation] == ["tgn1", "tgn3"]
    assert [n.name for n in p.spares] == ["tgn4"]
    assert p.lost == ()


def test_steps_from_scontrol() -> None:
    steps = parse_scontrol_steps((FIX / "scontrol_steps.txt").read_text())
    assert [(s.step_id, s.state, s.nodes) for s in steps] == [
        ("3.batch", "RUNNING", ("tgn1",)), ("3.0", "RUNNING", ("tgn1", "tgn3"))]
    assert steps_on(steps, 3) == steps and steps_on(steps, 4) == []
    assert parse_scontrol_steps("No job steps in the system\n") == []


def test_keyvalues_keep_values_with_spaces() -> None:
    f = parse_keyvalues("NodeName=n1 OS=Linux 6.1 #1 SMP Reason=tg incident i-1 [root@x] "
                        "SrunHost:Pid=vm:1")
    assert f == {"NodeName": "n1", "OS": "Linux 6.1 #1 SMP", "Reason": "tg incident i-1 [root@x]",
                 "SrunHost:Pid": "vm:1"}


def test_hostlists() -> None:
    assert expand_hostlist("tgn[1-3,10],login") == ("tgn1", "tgn2", "tgn3", "tgn10", "login")
    assert expand_hostlist("n[08-10]") == ("n08", "n09", "n10")
    assert expand_hostlist("") == ()
    for bad in ("n[3-1]", "n[a]", "n[1", "n]1"):
        with pytest.raises(SlurmParseError):
            expand_hostlist(bad)


@given(st.lists(st.integers(0, 5000), min_size=1, max_size=40, unique=True))
def test_hostlist_ranges_expand_to_their_members(nums: list[int]) -> None:
    nums = sorted(nums)
    text = "gpu[" + ",".join(str(n) for n in nums) + "]"
    assert expand_hostlist(text) == tuple(f"gpu{n}" for n in nums)


@pytest.mark.parametrize("text", ["", "{", "[]", '{"nodes": 3}', '{"nodes": [1]}',
                                  '{"errors": ["x"], "nodes": []}'])
def test_bad_json_is_a_parse_error(text: str) -> None:
    with pytest.raises(SlurmParseError, match="sinfo --json"):
        parse_sinfo_json(text)


@given(st.text(max_size=200))
def test_steps_parser_never_raises_anything_else(text: str) -> None:
    try:
        parse_scontrol_steps(text)
    except SlurmParseError:
        pass


@pytest.mark.parametrize(("message", "step", "spurious"), [
    # captured 2026-12-05: the step's USR1 trap ran, then scancel failed naming the job alone
    ("scancel --signal=USR1 2.1: exit 225: scancel: error: Kill job error on job step id 2: "
     "Invalid job id specified", "2.1", True),
    ("scancel --signal=TERM 12.0: exit 225: scancel: error: Kill job error on job step id 12: "
     "Invalid job id specified", "12.0", True),
    # a job that does not exist: the whole step id, exit 1
    ("scancel --signal=USR1 99.0: exit 1: scancel: error: Kill job error on job step id 99.0: "
     "Invalid job id specified", "99.0", False),
    # another job's id, or another failure
    ("scancel --signal=TERM 2.1: exit 225: scancel: error: Kill job error on job step id 12: "
     "Invalid job id specified", "2.1", False),
    ("scancel --signal=TERM 2.1: exit 225: scancel: error: Communication connection failure",
     "2.1", False),
])
def test_only_scancels_known_false_failure_is_ignored(message: str, step: str,
                                                      spurious: bool) -> None:
    from trainguard.actuators.slurm_cli import spurious_cancel_error
    assert spurious_cancel_error(message, step) is spurious


def test_the_allocations_end_from_squeues_job_state() -> None:
    text = (FIX / "squeue_job_states.txt").read_text()
    assert parse_job_state(text, 3) == ("RUNNING", "")
    assert parse_job_state(text, 1) == ("CANCELLED", "")
    assert parse_job_state(text, 2) == ("TIMEOUT", "TimeLimit")
    assert parse_job_state(text, 9) is None
    assert [scheduler_end(s) for s in ("RUNNING", "PENDING", "COMPLETING", "SUSPENDED")] == \
        [None] * 4
    assert scheduler_end("CANCELLED") is SchedulerEnd.CANCELLED
    assert scheduler_end("NODE_FAIL") is SchedulerEnd.NODE_FAIL
    assert scheduler_end(None) is SchedulerEnd.GONE  # aged out of slurmctld's memory
    assert SchedulerEnd.TIMEOUT.deliberate and not SchedulerEnd.NODE_FAIL.deliberate
    with pytest.raises(SlurmParseError, match=r"is not id\|STATE\|reason"):
        parse_job_state("3 RUNNING None\n", 3)


@given(st.text(max_size=200), st.integers(0, 10**6))
def test_the_job_state_parser_never_raises_anything_else(text: str, job: int) -> None:
    try:
        got = parse_job_state(text, job)
    except SlurmParseError:
        return
    assert got is None or (got[0] == got[0].upper() and got[0])
