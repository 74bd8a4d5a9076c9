"""Where the node agent's step socket lives. The trainer and the agent call the same function.

Order:

1. ``$TRAINGUARD_AGENT_SOCKET`` when set and not empty;
2. ``/run/trainguard/agent.sock`` when ``/run/trainguard`` exists (an agent made it) or
   ``/run`` is writable (we may make it): the production place, root agent and user trainers;
3. ``$XDG_RUNTIME_DIR/trainguard/agent.sock`` when that directory exists;
4. ``<tempdir>/trainguard-<uid>/agent.sock`` (per user, for development).

When the agent and the trainers run as different users without ``/run``, set the variable.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final

ENV_SOCKET: Final = "TRAINGUARD_AGENT_SOCKET"
RUN_DIR: Final = Path("/run")
DEFAULT_SOCKET: Final = RUN_DIR / "trainguard" / "agent.sock"
SOCKET_NAME: Final = "agent.sock"


def default_socket_path(
    environ: Mapping[str, str] | None = None, run_dir: Path = RUN_DIR
) -> Path:
    env = os.environ if environ is None else environ
    explicit = env.get(ENV_SOCKET)
    if explicit:
        return Path(explicit)
    ours = run_dir / "trainguard"
    if ours.is_dir() or os.access(run_dir, os.W_OK):
        return ours / SOCKET_NAME
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return Path(xdg) / "trainguard" / SOCKET_NAME
    return Path(tempfile.gettempdir()) / f"trainguard-{os.getuid()}" / SOCKET_NAME
