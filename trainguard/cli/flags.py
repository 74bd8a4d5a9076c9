"""The one flag-name scheme of every ``trainguard`` subcommand (docs/cli.md), as code: the
rules ``flag_problems`` checks (tests/unit/test_cli_style.py walks every subcommand with it),
and the deprecated spellings a renamed flag still accepts.

An old spelling is a separate, hidden argument (``help=argparse.SUPPRESS``) with the same
``dest``: it does exactly what the new flag does, and says once on stderr which name to use.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from typing import Any

# A duration's name carries its unit (the last word): seconds or milliseconds.
TIME_WORDS = frozenset({"interval", "duration", "timeout", "ttl", "within", "window", "age",
                        "wait", "settle", "lateness", "flush", "delay"})
UNITS = ("s", "ms")
# What a listening address or port serves: Prometheus /metrics, or pages / an HTTP API.
SERVED = ("metrics", "http")
# Who a key belongs to: decide's command key, an actuator's key; private key vs public keys.
SIGNERS = ("command", "actuator")
KEY_WORDS = ("key", "pubkey", "pubkeys")
# A start position in a topic vs a point in time.
OFFSET_FLAG = "--from-offset"
OFFSET_CHOICES = frozenset({"earliest", "latest"})
TIME_BOUNDS = ("--since", "--until")
# Nouns that say too little alone (the flag that says it, or the rule that decides).
AMBIGUOUS = {"--job": "--job-id", "--group": "--group-id", "--from": "--from-offset/--since",
             "--to": "--until", "--start": "--start-time", "--addr": "--<served>-addr",
             "--port": "--<served>-port", "--output": "--out", "--root": "--<what>-dir"}
LONG = re.compile(r"--[a-z][a-z0-9]*(-[a-z0-9]+)*")
SHORT = frozenset({"-v", "-h"})


def flag_problems(action: argparse.Action) -> list[str]:
    """Every way ``action``'s option strings break the scheme (empty: it follows it)."""
    problems = []
    for flag in action.option_strings:
        if flag in SHORT:
            continue
        if not LONG.fullmatch(flag):
            problems.append(f"{flag}: not --lowercase-words-with-hyphens")
            continue
        words = flag[2:].split("-")
        if flag in AMBIGUOUS:
            problems.append(f"{flag}: ambiguous alone (use {AMBIGUOUS[flag]})")
        if words[-1] in ("addr", "port") and (len(words) != 2 or words[0] not in SERVED):
            problems.append(f"{flag}: a listening address/port is --{{{','.join(SERVED)}}}-"
                            f"{words[-1]} (named by what it serves)")
        if "group" in words and words[-2:] != ["group", "id"]:
            problems.append(f"{flag}: a consumer group is named --...group-id")
        if any(w in TIME_WORDS for w in words) and words[-1] not in UNITS \
                and action.nargs != 0 and words[-1] != "time":
            problems.append(f"{flag}: a duration ends in its unit (-s or -ms)")
        if words[-1].endswith("dir") and words[-1] != "dir":
            problems.append(f"{flag}: a directory is --<what>-dir")
        if any(w in KEY_WORDS for w in words) and (
                len(words) != 2 or words[0] not in SIGNERS or words[1] not in KEY_WORDS):
            problems.append(f"{flag}: a key is --{{{','.join(SIGNERS)}}}-"
                            f"{{{','.join(KEY_WORDS)}}}")
        if "offset" in words and (flag != OFFSET_FLAG or not action.choices
                                  or set(action.choices) != OFFSET_CHOICES):
            problems.append(f"{flag}: a start position is {OFFSET_FLAG} "
                            f"{{{','.join(sorted(OFFSET_CHOICES))}}}")
        if action.choices and set(action.choices) >= OFFSET_CHOICES and flag != OFFSET_FLAG:
            problems.append(f"{flag}: a start position is {OFFSET_FLAG}")
        if "loglevel" in words or "datadir" in words:
            problems.append(f"{flag}: words are separated by hyphens")
    return problems


class DeprecatedAlias(argparse.Action):
    """An old spelling of ``target``: hidden from help, does what ``target`` does, and says
    on stderr (once per run) which name to use instead."""

    def __init__(self, option_strings: Sequence[str], dest: str, *,
                 target: argparse.Action, **_: Any) -> None:
        convert = target.type
        if isinstance(convert, str):  # argparse's registered type names: not used here
            raise ValueError(f"{target.option_strings}: give type as a callable")
        super().__init__(option_strings, dest, nargs=target.nargs, const=target.const,
                         default=argparse.SUPPRESS, type=convert, choices=target.choices,
                         help=argparse.SUPPRESS, metavar=target.metavar)
        self.target = target
        self.warned = False

    @property
    def new_flag(self) -> str:
        return self.target.option_strings[-1]

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        if not self.warned:
            print(f"trainguard: {option_string} is deprecated, use {self.new_flag}",
                  file=sys.stderr)
            self.warned = True
        self.target(parser, namespace, values, self.new_flag)


def renamed(parser: argparse.ArgumentParser, action: argparse.Action, *old: str) -> None:
    """Keep ``old`` spellings of ``action``'s flag working, hidden (docs/cli.md's table)."""
    if action.required:
        raise ValueError(f"{action.option_strings}: a required flag cannot have a hidden alias")
    for flag in old:
        parser.add_argument(flag, dest=action.dest, action=DeprecatedAlias, target=action)


def is_alias(action: argparse.Action) -> bool:
    return isinstance(action, DeprecatedAlias)


def version() -> str:
    """The installed distribution's version, else the package's own."""
    from importlib import metadata

    try:
        return metadata.version("trainguard")
    except metadata.PackageNotFoundError:
        from trainguard import __version__

        return __version__
