"""A restart while the job's checkpoint storage is read-only (a real read-only bind mount) is
refused before anything is fenced, marked retryable; once the storage is back it goes through."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_fencing import alive, job_spec
from trainguard.actuators import zygote
from trainguard.actuators.executor import Executor
from trainguard.actuators.fencing import stop_process
from trainguard.actuators.local import LocalBackend
from trainguard.events.envelope import Event
from trainguard.events.payloads import (
    Command,
    CommandAction,
    OutcomeStatus,
    PoolUnit,
    RestartData,
    RetryCondition,
    UnitState,
)

pytestmark = [
    pytest.mark.integration,
    # Under CI=true this runs (and fails without root); a developer without root may skip.
    pytest.mark.skipif(os.environ.get("CI") != "true" and os.geteuid() != 0,
                       reason="a read-only bind mount needs root"),
]


def command(action: CommandAction, n: int) -> Command:
    params = {"rank": 1, "ranks": [1]} if action is CommandAction.MIGRATE else {"rank": 1}
    return Command(command_id=f"c-{n}", idempotency_key=f"k-{n}", action=action, tier=2,
                   issued_at=1, issued_by="test", params=params)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """The checkpoint dir, bind-mounted onto itself; the test flips it read-only."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(exist_ok=True)
    subprocess.run(["mount", "--bind", str(ckpt), str(ckpt)], check=True)
    try:
        yield ckpt
    finally:
        subprocess.run(["umount", "-l", str(ckpt)], check=False)


def test_a_restart_is_refused_untouched_while_storage_is_read_only(
        tmp_path: Path, read_only: Path) -> None:
    spec = job_spec(tmp_path, ignore_term=False)
    events: list[Event] = []
    ex = Executor(spec, LocalBackend(tmp_path / "logs", use_cgroups=False), events.append)
    ex.register_units()
    try:
        ex.launch_initial()
        before = ex.replicas()
        subprocess.run(["mount", "-o", "remount,bind,ro", str(read_only)], check=True)
        for n, action in enumerate((CommandAction.MIGRATE, CommandAction.RESUME)):
            result = ex.execute(command(action, n))
            assert result.status is OutcomeStatus.FAILED, (action, result.detail)
            assert result.data == RestartData(action=action,
                                              retry=RetryCondition.STORAGE_UNREACHABLE), action
            assert "Read-only file system" in result.detail
        # nothing was touched: the same replicas run, nothing was fenced or bound
        assert ex.replicas() == before
        assert all(alive(rep.pid) for rep in before.values())
        states = [e.payload.state for e in events if isinstance(e.payload, PoolUnit)]
        assert UnitState.FENCED not in states and states.count(UnitState.BOUND) == 2

        subprocess.run(["mount", "-o", "remount,bind,rw", str(read_only)], check=True)
        result = ex.execute(command(CommandAction.MIGRATE, 9))
        assert result.status is OutcomeStatus.DONE, result.detail
        assert isinstance(result.data, RestartData) and result.data.retry is None
        assert ex.replicas()[1].unit != before[1].unit and result.data.epoch == 2
    finally:
        for rep in ex.replicas().values():
            stop_process(rep.pid, rep.create_time, 0.1)
        zygote.stop(tmp_path / "logs" / f"zygote-{spec.job_id}.sock")
