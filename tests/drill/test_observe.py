"""What a drill observes outside the log, on real processes and files: the census counts
replicas (not the helpers they fork) and sees two live replicas of a rank; the checkpoint
directory's leftovers are told apart from a save in progress."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from trainguard.drills.observe import Census, collect_settled

CHILD = ("import subprocess, sys, time\n"
         "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
         "time.sleep(30)\n")


def _spawn(job: str, rank: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TRAINGUARD_JOB_ID": job, "TRAINGUARD_RANK": str(rank),
           "TRAINGUARD_BINDING_EPOCH": "1"}
    return subprocess.Popen([sys.executable, "-c", CHILD], env=env, start_new_session=True)


def test_census_counts_replicas_not_their_helpers_and_sees_duplicates() -> None:
    job = f"census-{os.getpid()}"
    census = Census(job, interval_s=0.05)
    census.start()
    procs = [_spawn(job, 0)]
    try:
        time.sleep(2.0)
        assert census.max_live == {0: 1}, census.max_live  # its forked helper is not a replica
        assert census.pids({0}) == [procs[0].pid]
        procs.append(_spawn(job, 0))  # a second replica of rank 0
        time.sleep(2.0)
        assert census.max_live[0] == 2
        assert census.uids()[procs[0].pid] == os.getuid()
    finally:
        for p in procs:
            os.killpg(p.pid, 9)
            p.wait(10)
        census.stop()
    census.sample()
    assert census.pids() == []


def test_a_save_in_progress_is_not_a_leftover(tmp_path: Path) -> None:
    (tmp_path / ".state.pt.tmp-1-left").write_bytes(b"x")
    busy = tmp_path / ".rank-00000.json.tmp-2-busy"
    busy.write_bytes(b"y")
    threading.Timer(0.5, lambda: busy.rename(tmp_path / "done.json")).start()
    art = collect_settled(tmp_path, None, settle_s=1.5)
    assert art.temp_files == (".state.pt.tmp-1-left",)
    assert art.max_live_replicas is None and art.checkpoints == ()
