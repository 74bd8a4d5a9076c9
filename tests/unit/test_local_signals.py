"""Whether a rank handles SIGUSR1 yet, read from a recorded /proc status (SigCgt)."""

from __future__ import annotations

import signal
from pathlib import Path

from trainguard.actuators.local import catches


def _status(root: Path, pid: int, sigcgt: str) -> None:
    (root / str(pid)).mkdir()
    (root / str(pid) / "status").write_text(
        f"Name:\tpython\nState:\tS (sleeping)\nSigBlk:\t0000000000000000\n"
        f"SigIgn:\t0000000001001000\nSigCgt:\t{sigcgt}\n")


def test_sigcgt_bits_say_which_signals_are_caught(tmp_path: Path) -> None:
    _status(tmp_path, 7, "0000000180000200")  # SIGUSR1 (10) is bit 9; SIGINT would be bit 1
    _status(tmp_path, 8, "0000000180000002")  # SIGINT only
    assert catches(7, signal.SIGUSR1, tmp_path)
    assert not catches(8, signal.SIGUSR1, tmp_path) and catches(8, signal.SIGINT, tmp_path)
    assert not catches(9, signal.SIGUSR1, tmp_path)  # gone: no status file
