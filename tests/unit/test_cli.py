from __future__ import annotations

import argparse

import pytest

from trainguard.cli.main import build_parser, main


def _command_paths(parser: argparse.ArgumentParser,
                   prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = [prefix]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                paths += _command_paths(sub, (*prefix, name))
    return paths


PATHS = _command_paths(build_parser())


def test_there_are_subcommands() -> None:
    assert ("dev", "kafka", "start") in PATHS
    assert ("topics", "create") in PATHS
    assert ("demo",) in PATHS


@pytest.mark.parametrize("path", PATHS, ids=lambda p: " ".join(p) or "trainguard")
def test_every_subcommand_has_help(path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
                                   ) -> None:
    with pytest.raises(SystemExit) as info:
        main([*path, "--help"])
    assert info.value.code == 0
    assert "usage: trainguard" in capsys.readouterr().out


def test_events_validate_names_the_bad_line(tmp_path: pytest.TempPathFactory,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from trainguard.events import encode
    from trainguard.events.samples import sample_events

    path = tmp_path / "log.jsonl"  # type: ignore[operator]
    good = encode(sample_events()[0])
    path.write_bytes(good + b"\n" + good.replace(b'"seq":41', b'"seq":-1') + b"\n")
    assert main(["events", "validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert ":2: payload.seq" in err and "-1" in err
