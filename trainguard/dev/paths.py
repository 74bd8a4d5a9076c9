"""Where trainguard keeps what it fetches (cache) and what it runs (state), outside the repo."""

from __future__ import annotations

import os
from pathlib import Path


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
