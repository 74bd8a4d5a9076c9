"""One CLI style (docs/cli.md), walked from the parser itself: every argument of every
subcommand has help, every flag follows the scheme (``trainguard.cli.flags.flag_problems``),
every old spelling is a hidden alias doing what the new flag does, and ``--version`` works."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from importlib import metadata

import pytest

from trainguard.cli.flags import DeprecatedAlias, flag_problems, is_alias, version
from trainguard.cli.main import build_parser, main

pytestmark = pytest.mark.unit


def _walk(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
          ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*words, name))
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield words, parser, action


ARGS = list(_walk(build_parser()))
REAL = [(w, a) for w, _, a in ARGS if not is_alias(a)]
ALIASES = [(w, p, a) for w, p, a in ARGS if isinstance(a, DeprecatedAlias)]


def _id(words: tuple[str, ...], action: argparse.Action) -> str:
    return " ".join(words) + " " + (action.option_strings[-1] if action.option_strings
                                    else action.dest)


def test_the_walk_sees_every_argument() -> None:
    assert len(REAL) > 150 and len(ALIASES) >= 30
    assert any(w == ("metrics", "serve") and "--from-offset" in a.option_strings for w, a in REAL)


@pytest.mark.parametrize(("words", "action"), REAL, ids=[_id(w, a) for w, a in REAL])
def test_every_argument_has_help(words: tuple[str, ...], action: argparse.Action) -> None:
    assert action.help and action.help is not argparse.SUPPRESS and action.help.strip(), \
        f"trainguard {_id(words, action)}: no help"


def test_every_flag_follows_the_scheme() -> None:
    problems = [f"trainguard {' '.join(w)}: {p}" for w, a in REAL for p in flag_problems(a)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("flag", ["--group", "--job", "--from", "--to", "--addr", "--port",
                                  "--datadir", "--loglevel", "--key-file", "--interval",
                                  "--duration", "--timeout", "--series-ttl", "--root",
                                  "--output", "--web-port", "--start", "--watch-group"])
def test_the_scheme_refuses_each_old_spelling(flag: str) -> None:
    """The rules can fail: every renamed spelling breaks at least one of them."""
    parser = argparse.ArgumentParser()
    timed = flag in ("--interval", "--duration", "--timeout", "--series-ttl")
    action = (parser.add_argument(flag, type=float, help="x") if timed
              else parser.add_argument(flag, help="x"))
    assert flag_problems(action), flag


def test_the_scheme_keeps_what_it_should() -> None:
    parser = argparse.ArgumentParser()
    for flag in ("--group-id", "--metrics-port", "--http-addr", "--window-s", "--lateness-ms",
                 "--data-dir", "--command-key", "--actuator-pubkeys", "--job-id", "--since",
                 "--start-time", "--no-kernel-log", "--tier-windows"):
        assert not flag_problems(parser.add_argument(flag, help="x")), flag
    offset = parser.add_argument("--from-offset", choices=["earliest", "latest"], help="x")
    assert not flag_problems(offset)
    wrong = parser.add_argument("--start-at", choices=["earliest", "latest"], help="x")
    assert flag_problems(wrong)


@pytest.mark.parametrize(("words", "parser", "alias"), ALIASES,
                         ids=[_id(w, a) for w, _, a in ALIASES])
def test_an_old_spelling_is_hidden_and_does_what_the_new_flag_does(
        words: tuple[str, ...], parser: argparse.ArgumentParser, alias: DeprecatedAlias,
        capsys: pytest.CaptureFixture[str]) -> None:
    old, new = alias.option_strings[0], alias.new_flag
    assert old not in parser.format_help() or f"{old}-" in parser.format_help()
    assert new in parser.format_help()
    target = alias.target
    if target.nargs == 0:
        value: list[str] = []
    elif target.choices:
        value = [str(list(target.choices)[-1])]
    elif target.type in (int, float):
        value = ["7"]
    else:
        value = ["x1"]
    required = _required(parser)
    via_new = build_parser().parse_args([*words, *required, new, *value])
    via_old = build_parser().parse_args([*words, *required, old, *value])
    assert vars(via_old) == vars(via_new)
    err = capsys.readouterr().err
    assert err.strip() == f"trainguard: {old} is deprecated, use {new}"


def _required(parser: argparse.ArgumentParser) -> list[str]:
    out: list[str] = []
    for a in parser._actions:
        if a.required and a.option_strings:
            out += [a.option_strings[0], "x" if not a.choices else str(next(iter(a.choices)))]
        elif not a.option_strings and not isinstance(a, argparse._SubParsersAction) \
                and a.nargs not in ("?", "*"):
            out.append(str(next(iter(a.choices))) if a.choices else "x")
    return out


def test_version_is_the_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out == f"trainguard {version()}"
    assert version() == metadata.version("trainguard")


def test_version_falls_back_to_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import trainguard

    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    assert version() == trainguard.__version__
