"""The Slurm backend's pure part: step names, journal records, what is proven live, when
Slurm has given a step up, how fencing starts, the pool joined with the agents."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainguard.actuators.slurm_cli import SlurmCliError
from trainguard.actuators.slurm_steps import (
    StepRecord,
    fence_start,
    find_step,
    join_pool,
    latest,
    parse_step_name,
    proven_live,
    released,
    step_name,
    step_record_of,
)
from trainguard.actuators.slurm_view import (
    NodeHealth,
    SlurmJob,
    SlurmNode,
    SlurmStep,
    parse_scontrol_steps,
    parse_sinfo_json,
    parse_squeue_json,
    pool,
)

pytestmark = pytest.mark.unit
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"
JOB_IDS = st.from_regex(r"[a-z][a-z0-9.\-]{0,20}", fullmatch=True)


def node(name: str, state: str = "mixed", flags: tuple[str, ...] = (),
         features: tuple[str, ...] = ()) -> SlurmNode:
    return SlurmNode(name, "10.252.0.1", state, flags, "", features)


@given(JOB_IDS, st.integers(0, 1 << 20), st.integers(0, 1 << 30))
def test_step_names_round_trip(job: str, rank: int, epoch: int) -> None:
    assert parse_step_name(step_name(job, rank, epoch)) == (job, rank, epoch)


@given(st.text(max_size=40))
def test_other_names_are_not_ours(text: str) -> None:
    got = parse_step_name(text)
    assert got is None or step_name(*got) == text


@given(JOB_IDS, st.integers(0, 999), st.integers(0, 999), st.text(max_size=8))
def test_records_round_trip_and_reject_mismatched_names(job: str, rank: int, epoch: int,
                                                       step: str) -> None:
    rec = StepRecord(job, rank, epoch, "tgn1", 7, step_name(job, rank, epoch), 123, step)
    assert step_record_of(rec.to_record()) == rec
    forged = {**rec.to_record(), "epoch": epoch + 1}  # the name no longer says this epoch
    assert step_record_of(forged) is None
    assert step_record_of({**rec.to_record(), "rank": True}) is None
    assert step_record_of({"kind": "replica"}) is None


def test_the_record_with_a_step_id_wins() -> None:
    a = StepRecord("j", 1, 2, "tgn2", 1, "tg.j.r1.e2", 0)
    b = StepRecord("j", 1, 2, "tgn2", 1, "tg.j.r1.e2", 55, "1.0")
    assert latest([a, b], "j")[(1, 2)] == b
    assert latest([b, a], "j")[(1, 2)] == b
    assert latest([a, b], "other") == {}


STEPS = parse_scontrol_steps((FIX / "scontrol_steps_lost_node.txt").read_text())
NODES = [node("tgn1"), node("tgn2", "down", ("DRAIN",)), node("tgn3", features=("spare",))]
RECS = {(1, 1): StepRecord("sj", 1, 1, "tgn2", 1, "tg.sj.r1.e1", 9, "1.0"),
        (1, 2): StepRecord("sj", 1, 2, "tgn3", 1, "tg.sj.r1.e2", 10, "1.1")}


def test_a_lost_nodes_step_is_given_up_once_its_node_is_down_and_out_of_the_job() -> None:
    """Captured: 22.05 lists the lost node's step RUNNING after removing the node."""
    old = find_step(STEPS, 1, "tg.sj.r1.e1")
    assert old is not None and old.state == "RUNNING" and old.nodes == ("tgn2",)
    assert released(old, ("tgn1", "tgn3"), NODES)
    assert not released(old, ("tgn1", "tgn2", "tgn3"), NODES)  # still in the job
    assert not released(old, ("tgn1", "tgn3"), [node("tgn2")])  # its node not DOWN
    assert released(None, (), ())
    # only the relaunch on the spare is proven live: no duplicate replica of rank 1
    assert [r.epoch for r in proven_live(RECS, STEPS, ("tgn1", "tgn3"), NODES)] == [2]
    assert [r.epoch for r in proven_live(RECS, STEPS)] == [1, 2]  # without the job's view


def test_a_step_listed_under_another_name_is_not_proven() -> None:
    recs = {(1, 2): StepRecord("sj", 1, 2, "tgn3", 1, "tg.sj.r1.e2", 10, "1.0")}
    assert proven_live(recs, STEPS) == []  # 1.0 is named tg.sj.r1.e1 in Slurm


def test_fencing_a_lost_node_starts_by_setting_it_down() -> None:
    assert fence_start(node("tgn2", "idle", ("NOT_RESPONDING",))) == "down_first"
    assert fence_start(node("tgn2", "down")) == "down_first"
    assert fence_start(None) == "down_first"
    assert fence_start(node("tgn2", "mixed")) == "cancel"
    assert fence_start(node("tgn2", "mixed", ("DRAIN",))) == "cancel"


def test_the_pool_joins_slurm_with_the_agents() -> None:
    view = pool(NODES, SlurmJob(1, "tg", "RUNNING", ("tgn1", "tgn2")))
    joined = {p.name: p for p in join_pool(view, heard={"tgn1", "tgn3"})}
    assert {n: p.role for n, p in joined.items()} == {"tgn1": "allocated", "tgn2": "allocated",
                                                     "tgn3": "spare"}
    assert [n for n, p in joined.items() if p.placeable] == ["tgn1", "tgn3"]
    assert joined["tgn2"].health is NodeHealth.DOWN
    silent = {p.name: p.placeable for p in join_pool(view, heard={"tgn1"})}
    assert silent == {"tgn1": True, "tgn2": False, "tgn3": False}  # Slurm-usable, agent silent
    assert all(p.agent for p in join_pool(view, heard=None))


class _ViewCli:
    """Slurm's view from the captured fixtures (job 3 on tgn1,tgn3; tgn2 drained)."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def nodes(self) -> list[SlurmNode]:
        if self.fail:
            raise SlurmCliError("sinfo --json: no answer in 15 s")
        return parse_sinfo_json((FIX / "sinfo_drain.json").read_text())

    def job(self, job_id: int) -> SlurmJob | None:
        return next((j for j in parse_squeue_json((FIX / "squeue_running.json").read_text())
                     if j.job_id == job_id), None)


def test_the_pool_joins_the_spec_with_slurms_view(tmp_path: Path) -> None:
    from trainguard.actuators.backend import KnowsHealth
    from trainguard.actuators.slurm import SlurmBackend

    be = SlurmBackend(_ViewCli(), 3, tmp_path)  # type: ignore[arg-type]
    assert isinstance(be, KnowsHealth)
    assert be.unusable(["tgn1", "tgn2", "tgn3", "tgn4", "tgn9"]) == {
        "tgn2": "slurm: idle+DRAIN, reason 'tg incident i-123'",
        "tgn4": "slurm: not in allocation 3 (tgn1,tgn3)",
        "tgn9": "slurm knows no node tgn9",
    }
    # Slurm's view unreadable: the job spec stands
    blind = SlurmBackend(_ViewCli(fail=True), 3, tmp_path)  # type: ignore[arg-type]
    assert blind.unusable(["tgn2"]) == {}


class _LosingCli:
    """A step on tgn1 that Slurm stops listing after the TERM, because it lost tgn1
    meanwhile (responding at the first look, not responding at the second): what a partition
    outlasting SlurmdTimeout looks like from the head."""

    def __init__(self) -> None:
        self.looks = 0
        self.calls: list[tuple[str, ...]] = []

    def nodes(self) -> list[SlurmNode]:
        self.looks += 1
        flags = ("DRAIN",) if self.looks == 1 else ("DRAIN", "NOT_RESPONDING")
        return [SlurmNode("tgn1", "10.0.0.1", "allocated", flags, "trainguard c1", ())]

    def steps(self) -> list[SlurmStep]:
        listed = not any(c[0] == "cancel" for c in self.calls)
        return [SlurmStep("7.0", "tg.j.r0.e1", "RUNNING", ("tgn1",))] if listed else []

    def job(self, job_id: int) -> SlurmJob | None:
        return SlurmJob(7, "alloc", "RUNNING", ("tgn1",))

    def cancel_step(self, step_id: str, signal: str) -> None:
        self.calls.append(("cancel", step_id, signal))

    def set_down(self, node: str, reason: str) -> None:
        self.calls.append(("down", node, reason))


def test_a_step_slurm_gives_up_during_the_cancel_is_not_confirmed_by_it(tmp_path: Path) -> None:
    from trainguard.actuators.backend import Replica
    from trainguard.actuators.jobspec import JobSpec, UnitSpec
    from trainguard.actuators.slurm import SlurmBackend

    cli = _LosingCli()
    be = SlurmBackend(cli, 7, tmp_path)  # type: ignore[arg-type]
    be.journal.append(StepRecord("j", 0, 1, "tgn1", 7, "tg.j.r0.e1", 0, "7.0").to_record())
    job = JobSpec(job_id="j", world_size=1, command=("true",),
                  units=(UnitSpec("tgn1", (), 0),), ckpt_dir=tmp_path, grace_s=0.1)
    said = be.fence(job, Replica(0, "tgn1", 1, 0)).items[0]
    assert "node lost during the cancel, node set DOWN, not powered off" in said, said
    assert ("down", "tgn1", "trainguard c1; fencing 7.0 (node lost during the cancel)") \
        in cli.calls
