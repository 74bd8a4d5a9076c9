"""The reference workload's pure parts: the data stream is a function of (seed, global sample
index), ranks take disjoint consecutive slices; the CLI refuses bad input before joining."""

from __future__ import annotations

import pytest
import torch

from trainguard.workload import ddp
from trainguard.workload.data import SampleStream


def test_the_stream_is_addressed_by_the_global_sample_index() -> None:
    a, b = SampleStream(5, size=64), SampleStream(5, size=64)
    xa, ya = a.batch(40, 50)  # crosses the epoch boundary at 64
    xb1, yb1 = b.batch(40, 24)
    xb2, yb2 = b.batch(64, 26)
    assert torch.equal(xa, torch.cat([xb1, xb2])) and torch.equal(ya, torch.cat([yb1, yb2]))
    other = SampleStream(6, size=64)
    assert not torch.equal(other.batch(0, 8)[0], a.batch(0, 8)[0])


def test_each_epoch_is_a_permutation_of_the_set() -> None:
    s = SampleStream(1, size=32)
    for epoch in (0, 1):
        x, _ = s.batch(epoch * 32, 32)
        assert sorted(map(tuple, x.tolist())) == sorted(map(tuple, s.x.tolist()))
    assert not torch.equal(s.batch(0, 32)[0], s.batch(32, 32)[0])  # a new order each pass
    assert s.epoch_of(31) == 0 and s.epoch_of(32) == 1


def test_rank_slices_tile_the_global_batch() -> None:
    s = SampleStream(0, size=100)
    world, per_rank, position = 3, 4, 20
    slices = [s.rank_slice(position, r, per_rank) for r in range(world)]
    assert slices == [(20, 4), (24, 4), (28, 4)]


def test_a_tmp_checkpoint_dir_is_refused_naming_the_flags(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = ddp.main(["--job-id", "j", "--rank", "0", "--world-size", "1", "--master-port", "1",
                     "--ckpt-dir", "/tmp/tg-refused-ckpt", "--steps", "1"])
    assert code == ddp.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--ckpt-dir" in err and "--allow-tmp-ckpt" in err


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["--rank", "2", "--world-size", "2"], {}, "--rank 2"),
    (["--rank", "0", "--world-size", "1", "--steps", "0"], {}, "--steps"),
    (["--rank", "0", "--world-size", "1"], {ddp.ENV_BINDING_EPOCH: "minus-one"},
     "TRAINGUARD_BINDING_EPOCH"),
    (["--rank", "0"], {}, "--rank and --world-size"),
    # no --rank: the launcher's (torchrun's) identity, checked the same way
    ([], {"RANK": "3", "WORLD_SIZE": "2"}, "RANK: 3 is not in 0..1"),
    ([], {"SLURM_PROCID": "x", "SLURM_NTASKS": "2"}, "SLURM_PROCID='x'"),
])
def test_bad_arguments_exit_2_naming_the_field(argv: list[str], env: dict[str, str],
                                               needle: str, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    for var in ("TRAINGUARD_RANK", "RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    base = ["--job-id", "j", "--master-port", "1", "--ckpt-dir", "/x", "--steps", "1"]
    with pytest.raises(SystemExit) as info:
        ddp.main(base + argv)
    assert info.value.code == ddp.EXIT_USAGE
    assert needle in capsys.readouterr().err


def test_an_elastic_slot_reports_its_slot_and_joins_at_torchruns_rank(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Under torchrun run by the actuator (an elastic job) ``TRAINGUARD_RANK`` is the unit's
    slot and ``RANK`` the group rank the rendezvous gave this round: reported as the first,
    joined (and fed the data shard) as the second. A torchrun world other than the job's is
    refused in one line."""
    for var in ("SLURM_PROCID", "TRAINGUARD_BINDING_EPOCH_FILE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in {"TRAINGUARD_JOB_ID": "j", "TRAINGUARD_RANK": "2",
                       "TRAINGUARD_WORLD_SIZE": "3", "RANK": "1", "WORLD_SIZE": "3"}.items():
        monkeypatch.setenv(var, value)
    ap = ddp.parser()
    args = ap.parse_args(["--ckpt-dir", "/x", "--steps", "1"])
    ddp._check(ap, args)
    assert (args.rank, args.group_rank, args.world_size) == (2, 1, 3)
    monkeypatch.setenv("WORLD_SIZE", "6")  # two workers per node: not modelled
    with pytest.raises(SystemExit):
        ddp._check(ap, ap.parse_args(["--ckpt-dir", "/x", "--steps", "1"]))
    assert "RANK '1' with WORLD_SIZE '6'" in capsys.readouterr().err
