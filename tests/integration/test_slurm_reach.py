"""The probe a Slurm spare passes before it takes a rank (``slurm_steps.reach_script``), run by
a real ``sh`` here as a probe step runs it on the node: the job's storage takes a file, and the
node's agent answers on its step socket (a real datagram socket), the path taken literally."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainguard.actuators.slurm_steps import reach_script

pytestmark = pytest.mark.integration


def run(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                          env={**os.environ, **env})


@contextlib.contextmanager
def agent(path: Path) -> Iterator[None]:
    """What a node's agent holds: a bound datagram socket at its step socket path."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    try:
        yield
    finally:
        sock.close()


def test_storage_and_a_live_agent_pass(tmp_path: Path) -> None:
    with agent(tmp_path / "agent.sock"):
        done = run(reach_script(str(tmp_path), "tgn4", str(tmp_path / "agent.sock")))
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / ".reach-tgn4").exists()  # the probe file is removed


def test_a_dead_or_missing_agent_fails_with_the_reason(tmp_path: Path) -> None:
    sock = tmp_path / "agent.sock"
    missing = run(reach_script(str(tmp_path), "tgn4", str(sock)))
    assert missing.returncode != 0
    assert missing.stderr.strip().splitlines()[-1] == \
        f"agent socket {sock}: No such file or directory"
    with agent(sock):
        pass  # the agent died: its socket file is left, nobody holds it
    dead = run(reach_script(str(tmp_path), "tgn4", str(sock)))
    assert dead.stderr.strip().splitlines()[-1] == f"agent socket {sock}: Connection refused"


def test_storage_that_takes_no_file_fails_before_the_agent_is_asked(tmp_path: Path) -> None:
    done = run(reach_script(str(tmp_path / "gone"), "tgn4", str(tmp_path / "agent.sock")))
    assert done.returncode != 0
    assert "touch" in done.stderr and "agent socket" not in done.stderr


def test_no_agent_socket_named_checks_storage_only(tmp_path: Path) -> None:
    assert run(reach_script(str(tmp_path), "tgn4", None)).returncode == 0
    assert "python3" not in reach_script(str(tmp_path), "tgn4", None)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.text(st.characters(min_codepoint=32, max_codepoint=126,
                                  blacklist_characters="/"), min_size=1, max_size=20))
def test_any_literal_path_reaches_the_probe_as_written(tmp_path: Path, name: str) -> None:
    """Quotes, backslashes, backticks, ``$`` and spaces in the directory or socket name stay
    literal: the path the probe asks is the path the ranks get."""
    if name in (".", ".."):
        return
    d = tmp_path / name
    d.mkdir(exist_ok=True)
    sock = d / "a.sock"
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()
    with agent(sock):
        done = run(reach_script(str(d), "n", str(sock)))
    assert done.returncode == 0, (name, done.stderr)
    missing = run(reach_script(str(d), "n", str(d / "none.sock")))
    assert missing.stderr.strip().splitlines()[-1] == \
        f"agent socket {d / 'none.sock'}: No such file or directory"
