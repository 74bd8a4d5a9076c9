"""Fixtures for the SDK's own tests (plain pytest, standard library only)."""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def agent_socket() -> Iterator[tuple[Path, socket.socket]]:
    """A bound Unix datagram socket standing in for the node agent (AF_UNIX paths are limited
    to 107 bytes: pytest's tmp_path can be longer)."""
    d = Path(tempfile.mkdtemp(prefix="tgsdk", dir="/tmp"))
    path = d / "agent.sock"
    rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.bind(str(path))
    rx.settimeout(5.0)
    try:
        yield path, rx
    finally:
        rx.close()
        shutil.rmtree(d, ignore_errors=True)
