"""A unix socket under a run directory deep in a clone (or with a space in it) still binds: a
path too long for sun_path gets a short stand-in, one per path; a short path is kept."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from trainguard.actuators import zygote
from trainguard.dev.paths import SUN_PATH_MAX, unix_socket_path

DEEP = Path("/tmp") / ("a clone " * 20) / ".run" / "demo" / "20261203T120000" / "ranks"


def test_a_short_path_is_kept() -> None:
    assert unix_socket_path(Path("/tmp/a clone/agent.sock")) == Path("/tmp/a clone/agent.sock")


@given(st.text(st.characters(codec="utf-8", exclude_characters="/\x00"), min_size=1,
               max_size=40))
def test_a_long_path_gets_one_short_stand_in(name: str) -> None:
    path = DEEP / name / "zygote-demo-job.sock"
    short = unix_socket_path(path)
    assert len(os.fsencode(short)) <= SUN_PATH_MAX
    assert short == unix_socket_path(path)  # the actuator and the zygote meet there
    assert short != unix_socket_path(DEEP / f"{name}x" / "zygote-demo-job.sock")
    assert short.name.endswith("-zygote-demo-job.sock")
    assert zygote.socket_path(path) == short


def test_the_stand_in_binds(tmp_path: Path) -> None:
    path = tmp_path / ("a clone " * 20) / "agent.sock"
    short = unix_socket_path(path)
    short.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(short))
    short.unlink()
