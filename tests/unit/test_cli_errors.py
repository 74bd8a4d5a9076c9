"""Every subcommand, walked from the argparse parser itself: each file it reads tried missing, as a
directory and malformed; each that needs Kafka tried against a closed local port. Each must end
with ONE error line on stderr and exit 2 (or its documented code), never a traceback.

A new subcommand is picked up by the walk; a new argument naming a file it reads must use
``trainguard.cli.common.input_file`` (``test_every_path_argument_is_an_input_or_an_output``).
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests import keys
from trainguard.actuators.jobspec import ddp_job_doc
from trainguard.cli.common import input_file
from trainguard.cli.flags import is_alias
from trainguard.cli.main import build_parser, main
from trainguard.events import encode
from trainguard.events.samples import sample_events

pytestmark = pytest.mark.unit

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")
# Path arguments a command writes or creates (not read): not walked with bad files.
OUTPUTS = {"out", "state_dir", "spool_dir", "socket", "run_dir", "runs_dir", "data_dir", "dir"}
# Documented exceptions, with the reason; everything else must exit 2.
EXIT_CODES: dict[tuple[str, ...], dict[str, int]] = {
    ("events", "validate"): {"malformed": 1},  # 1: "N invalid record(s)" found, its result
}
SKIP: dict[tuple[str, ...], dict[str, str]] = {
    ("agent",): {"missing": "a fault log is followed until it appears (like tail -F)",
                 "malformed": "bad fault-log rows are counted and skipped, not fatal",
                 "broker": "the agent spools through broker outages by design"},
}


@dataclass(frozen=True)
class Command:
    words: tuple[str, ...]
    parser: argparse.ArgumentParser

    @property
    def name(self) -> str:
        return " ".join(self.words)

    def actions(self) -> list[argparse.Action]:
        return [a for a in self.parser._actions  # an old, hidden spelling is the same argument
                if not isinstance(a, argparse._SubParsersAction | argparse._HelpAction)
                and not is_alias(a)]

    def files(self) -> list[argparse.Action]:
        """The arguments naming a file the command reads (every positional may be one)."""
        return [a for a in self.actions() if a.type is input_file
                or (not a.option_strings and not a.choices  # a choice is no file,
                    and a.dest not in OUTPUTS)]  # nor a folder it writes

    @property
    def needs_kafka(self) -> bool:
        return any("--bootstrap" in a.option_strings for a in self.actions())


def _walk(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[Command]:
    if parser.get_default("func") is not None:
        yield Command(words, parser)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*words, name))


COMMANDS = list(_walk(build_parser()))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when the with block ends


BOOTSTRAP = f"127.0.0.1:{_closed_port()}"


def _good(dest: str, tmp: Path) -> Path:
    """A valid file for an input argument the walk does not test right now."""
    path = tmp / f"good-{dest}"
    if dest == "job_spec":
        path.write_text(yaml.safe_dump(ddp_job_doc("walk-job", world_size=1, spares=0,
                                                   ckpt_dir=tmp / "ckpt", node="n1",
                                                   agent_socket=None)))
    elif dest == "config":
        path.write_text("channels: [{name: a, type: webhook, url: 'http://127.0.0.1:9/x'}]\n")
    elif dest in ("command_key", "actuator_key"):
        path.write_text((keys.COMMAND if dest == "command_key" else keys.ACTUATOR).hex())
    elif dest in ("command_pubkey", "actuator_pubkeys"):
        key = keys.COMMAND if dest == "command_pubkey" else keys.ACTUATOR
        path.write_text(key.public().hex())
    elif dest in ("log", "file", "fault_log"):
        path.write_bytes(encode(sample_events()[0]) + b"\n")
    elif dest == "rules":
        path.write_text("rules: [{id: liveness, kind: liveness}]\n")
    else:
        raise AssertionError(f"no valid sample for input {dest!r}: add one to _good()")
    return path


def _bad(kind: str, tmp: Path) -> Path:
    if kind == "missing":
        return tmp / "no-such-file"
    if kind == "directory":
        (tmp / "a-dir").mkdir(exist_ok=True)
        return tmp / "a-dir"
    path = tmp / "malformed"
    path.write_bytes(b"\xff\xfe: [unclosed\n")  # neither UTF-8 nor YAML nor JSON
    return path


def _argv(cmd: Command, tmp: Path, bad: argparse.Action | None = None,
          bad_path: Path | None = None) -> list[str]:
    argv = list(cmd.words)
    for a in cmd.actions():
        if a is bad:
            value: str = str(bad_path)
        elif a.dest.endswith("port") and a.option_strings:
            value = "0"  # never bind a fixed port
        elif not a.required:
            continue
        elif a.type is input_file:
            value = str(_good(a.dest, tmp))
        elif a.choices:
            value = str(next(iter(a.choices)))
        else:
            value = "abcd1234"
        argv += [a.option_strings[0], value] if a.option_strings else [value]
    if cmd.needs_kafka:
        argv += ["--bootstrap", BOOTSTRAP]
    return argv


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str]]:
    code = main(argv)
    err = capsys.readouterr().err
    return code, [line for line in err.splitlines() if line.strip() and not LOG_LINE.match(line)]


def _check(cmd: Command, case: str, code: int, lines: list[str]) -> None:
    text = "\n".join(lines)
    assert "Traceback" not in text and "internal error" not in text, text
    assert len(lines) == 1, f"{cmd.name} ({case}): want one error line, got:\n{text}"
    want = EXIT_CODES.get(cmd.words, {}).get(case, 2)
    assert code == want, f"{cmd.name} ({case}): exit {code}, want {want}: {text}"


FILE_CASES = [(c, a.dest, kind) for c in COMMANDS for a in c.files()
              for kind in ("missing", "directory", "malformed")
              if kind not in SKIP.get(c.words, {})]


def test_the_walk_finds_the_commands_and_their_files() -> None:
    names = {c.name for c in COMMANDS}
    assert {"topics list", "topics create", "events validate", "events tail", "streams",
            "decide", "actuator", "incident list", "replay", "replay export"} <= names
    walked = {(c, d) for c, d, _ in FILE_CASES}
    assert any(c.name == "streams" and d == "rules" for c, d in walked)
    assert any(c.name == "actuator" and d == "job_spec" for c, d in walked)


@pytest.mark.parametrize(("cmd", "dest", "kind"), FILE_CASES,
                         ids=[f"{c.name}-{d}-{k}" for c, d, k in FILE_CASES])
def test_a_bad_file_is_one_line_and_exit_2(cmd: Command, dest: str, kind: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINGUARD_STATE", str(tmp_path / "state"))
    for name, value in keys.env().items():
        monkeypatch.setenv(name, value)
    action = next(a for a in cmd.files() if a.dest == dest)
    bad = _bad(kind, tmp_path)
    code, lines = _run(_argv(cmd, tmp_path, action, bad), capsys)
    _check(cmd, kind, code, lines)
    if action.type is input_file:  # a plain positional may be a name, not a file
        assert str(bad) in lines[0], lines[0]


BROKER_CASES = [c for c in COMMANDS if c.needs_kafka and "broker" not in SKIP.get(c.words, {})]


@pytest.mark.parametrize("cmd", BROKER_CASES, ids=[c.name for c in BROKER_CASES])
def test_no_broker_is_one_line_naming_the_bootstrap(cmd: Command, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINGUARD_STATE", str(tmp_path / "state"))
    for name, value in keys.env().items():
        monkeypatch.setenv(name, value)
    code, lines = _run(_argv(cmd, tmp_path), capsys)
    _check(cmd, "broker", code, lines)
    assert BOOTSTRAP in lines[0], lines[0]


def test_every_path_argument_is_an_input_or_an_output() -> None:
    for cmd in COMMANDS:
        for a in cmd.actions():
            if a.type is Path:
                assert a.dest in OUTPUTS, (
                    f"{cmd.name} {a.option_strings}: a file it reads must use "
                    "type=trainguard.cli.common.input_file (walked by this test); "
                    "one it writes belongs in OUTPUTS")


def test_an_unexpected_error_is_one_line_exit_1_and_a_traceback_only_with_debug(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import trainguard.cli.dashboards as dashboards

    def boom(*_: object) -> object:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr("trainguard.dashboards.build.build_all", boom)
    assert dashboards is not None
    code, lines = _run(["dashboards", "queries"], capsys)
    assert code == 1 and len(lines) == 1
    assert "internal error: ZeroDivisionError: a bug" in lines[0] and "--debug" in lines[0]
    with pytest.raises(ZeroDivisionError):
        main(["--debug", "dashboards", "queries"])


# A few real processes: the interpreter's own traceback printing is what they would show.
SUBPROCESS_CASES = [
    ["topics", "list", "--bootstrap", BOOTSTRAP],
    ["events", "tail", "--bootstrap", BOOTSTRAP],
    ["events", "validate", "/"],
    ["streams", "--rules", "NAN_RULES", "--bootstrap", BOOTSTRAP],
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("argv", SUBPROCESS_CASES, ids=lambda a: " ".join(a[:2]))
def test_a_real_process_fails_in_one_line_and_quickly(argv: list[str], tmp_path: Path) -> None:
    rules = tmp_path / "nan.yaml"
    rules.write_text("allowed_lateness_ms: .nan\nrules: [{id: l, kind: liveness, "
                     "parameters: {floor_ms: .inf}}]\n")
    argv = [str(rules) if a == "NAN_RULES" else a for a in argv]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-m", "trainguard.cli.main", *argv], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    lines = [x for x in proc.stderr.splitlines() if x.strip() and not LOG_LINE.match(x)]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and proc.returncode == 2, proc.stderr
    assert lines[0].startswith("trainguard ")


# what Slurm's squeue says (exit 1) when it lists no such job, and when slurmctld is away
SQUEUE = {"no such job": "slurm_load_jobs error: Invalid job id specified",
          "no controller": "slurm_load_jobs error: Unable to contact slurm controller "
                           "(connect failure)"}


@pytest.mark.parametrize("case", list(SQUEUE))
def test_a_slurm_job_that_cannot_be_found_stops_the_actuator_in_one_line(
        case: str, tmp_path: Path) -> None:
    """``--backend slurm --slurm-job N`` is checked before anything runs: a wrong id (or one
    gone longer than MinJobAge), or a slurmctld that does not answer, is one line and exit 2
    (a fake ``squeue`` on PATH says what the real one says)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "squeue"
    fake.write_text(f"#!/bin/sh\necho '{SQUEUE[case]}' >&2\nexit 1\n")
    fake.chmod(0o755)
    argv = ["actuator", "--backend", "slurm", "--slurm-job", "424242", "--bootstrap", BOOTSTRAP,
            "--job-spec", str(_good("job_spec", tmp_path)),
            "--command-pubkey", str(_good("command_pubkey", tmp_path)),
            "--actuator-key", str(_good("actuator_key", tmp_path)),
            "--state-dir", str(tmp_path / "state")]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, "-m", "trainguard.cli.main", *argv], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    lines = [x for x in proc.stderr.splitlines() if x.strip() and not LOG_LINE.match(x)]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1 and proc.returncode == 2, proc.stderr
    assert lines[0].startswith("trainguard actuator: --slurm-job 424242: "), lines
    assert ("Slurm lists no such job" if case == "no such job"
            else "Unable to contact slurm controller") in lines[0]


@pytest.mark.parametrize("bootstrap", ["127.0.0.1:notaport", "h:0", "a:1,:2"])
def test_a_malformed_bootstrap_is_one_line(bootstrap: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = _run(["topics", "list", "--bootstrap", bootstrap], capsys)
    assert code == 2 and len(lines) == 1 and "is not host:port" in lines[0], lines


@pytest.mark.parametrize(("meta", "field"), [(b"\xff", "not valid UTF-8"), (b"{", "not JSON"),
                                             (b"{}", "'run_id'"),
                                             (b'{"run_id": "r", "scenarios": [1]}',
                                              "'scenarios'")])
@pytest.mark.parametrize("action", ["verify", "report"])
def test_a_broken_drill_run_is_one_line(meta: bytes, field: str, action: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "run.json").write_bytes(meta)
    code, lines = _run(["drill", action, str(tmp_path)], capsys)
    assert code == 2 and len(lines) == 1 and field in lines[0], lines
    assert str(tmp_path / "run.json") in lines[0]


@pytest.mark.parametrize(("argv", "what"), [
    (["agent", "--job-id", "bad id"], "job id 'bad id'"),
    (["agent", "--node", ""], "node ''"),
    (["decide", "--job-id", "x" * 200], "job id 'xxx"),
])
def test_an_id_that_breaks_the_contract_is_refused_before_running(
        argv: list[str], what: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in keys.env().items():
        monkeypatch.setenv(name, value)
    code, lines = _run([*argv, "--bootstrap", BOOTSTRAP], capsys)
    assert code == 2 and len(lines) == 1, lines
    assert what in lines[0] and "breaks the event contract" in lines[0]
