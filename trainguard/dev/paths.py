"""Where trainguard keeps what it fetches (cache) and what it runs (state), outside the repo."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

# A unix socket's address holds at most 107 bytes of path (sun_path, with its NUL): a run
# directory deep in a clone is longer.
SUN_PATH_MAX = 107


def cache_dir() -> Path:
    if explicit := os.environ.get("TRAINGUARD_CACHE"):
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "trainguard"


def state_dir() -> Path:
    if explicit := os.environ.get("TRAINGUARD_STATE"):
        return Path(explicit)
    xdg = os.environ.get("XDG_STATE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".local" / "state") / "trainguard"


def unix_socket_path(path: Path) -> Path:
    """``path`` when it fits a unix socket address, else a short stand-in named by it:
    ``<tmp>/trainguard-<uid>/<hash of path>-<name>`` (one path, one stand-in)."""
    if len(os.fsencode(path)) <= SUN_PATH_MAX:
        return path
    digest = hashlib.sha256(os.fsencode(path.absolute())).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"trainguard-{os.getuid()}" / f"{digest}-{path.name}"
