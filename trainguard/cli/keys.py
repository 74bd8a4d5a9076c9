"""`trainguard keys gen DIR`: a fresh Ed25519 key set for decide and an actuator."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keys", help="signing keys for commands, outcomes and pool events")
    ks = p.add_subparsers(dest="keys_cmd", required=True)
    g = ks.add_parser("gen", help="write command.key/.pub (decide's) and actuator.key, "
                      "actuators.pub (an actuator's) into DIR; refuses to overwrite")
    g.add_argument("dir", type=Path, help="directory to write the key files into")
    g.set_defaults(func=_gen)


def _gen(args: argparse.Namespace) -> int:
    from trainguard.actuators.signing import SigningKeyError, generate

    try:
        paths = generate(args.dir)
    except (SigningKeyError, OSError) as exc:
        raise SystemExit(f"trainguard keys gen: {exc}") from None
    for name, path in paths.items():
        print(f"{name}: {path}")
    return 0
