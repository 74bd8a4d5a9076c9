"""Run a rank inside the network namespace of its unit's (logical) node, so that link faults
on the veth between the drill's namespaces act on the job's own traffic.

    python -m trainguard.drills.netwrap --map MAP.json --unit u1 -- python -m ... ddp ...

``MAP.json`` maps a unit to ``[netns, interface]``. The wrapper execs
``ip netns exec NETNS env GLOO_SOCKET_IFNAME=IF <command>``: the pid stays the rank's (the
local backend, the agent and fencing see the same process)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def argv_for(mapping: dict[str, list[str]], unit: str, command: list[str]) -> list[str]:
    """The exec argv for ``unit``. Pure; KeyError names a unit the map lacks."""
    if unit not in mapping:
        raise KeyError(f"--unit {unit!r}: not in the namespace map ({sorted(mapping)})")
    netns, ifname = mapping[unit]
    return ["ip", "netns", "exec", netns, "env", f"GLOO_SOCKET_IFNAME={ifname}", *command]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainguard.drills.netwrap")
    ap.add_argument("--map", type=Path, required=True)
    ap.add_argument("--unit", required=True)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        ap.error("a command after --")
    try:
        exec_argv = argv_for(json.loads(a.map.read_text()), a.unit, command)
    except (OSError, ValueError, KeyError) as exc:
        print(f"netwrap: {exc}", file=sys.stderr)
        return 2
    os.execvp(exec_argv[0], exec_argv)


if __name__ == "__main__":
    sys.exit(main())
