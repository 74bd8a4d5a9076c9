"""README.md's "Run it on your cluster": every file it names exists and parses (YAML with
PyYAML, the systemd unit as systemd reads it, with the keys a unit needs), and every command
line in it, in the unit and in the DaemonSet parses against the real `trainguard` parser."""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.actuators import signing
from trainguard.cli.flags import KEY_WORDS
from trainguard.cli.main import build_parser
from trainguard.dashboards.common import TIMELINE_DEFAULT

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
TITLE = "## Run it on your cluster\n"
LINK = re.compile(r"\]\(([^)#\s]+)\)")
TICKED = re.compile(r"`((?:deploy|dashboards|docs|rules|sdk)/[^`\s]*|docker-compose\.yml)`")
UNIT_NEEDS = {"Unit": {"Description"}, "Service": {"ExecStart", "Restart"},
              "Install": {"WantedBy"}}


def _section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(TITLE)
    end = text.find("\n## ", start + len(TITLE))
    return text[start:end if end != -1 else len(text)]


def _named() -> list[str]:
    section = _section()
    names = LINK.findall(section) + TICKED.findall(section)
    return sorted({n for n in names if not n.startswith(("http://", "https://"))})


def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file: ``[Section]`` headers, ``Key=Value`` lines (a key may repeat),
    ``#``/``;`` comments, backslash continuations. One clear error per bad line."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    lines = text.replace("\\\n", " ").splitlines()
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], defaultdict(list))
            continue
        key, sep, value = line.partition("=")
        if current is None or not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", key.strip()):
            raise ValueError(f"line {lineno}: not [Section] or Key=Value: {line!r}")
        current[key.strip()].append(value.strip())
    return sections


def _parses(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)  # SystemExit (a failure) if it is not a command
    assert callable(args.func), argv


def test_the_section_names_the_agent_files_and_the_hook_ups() -> None:
    named = _named()
    for needed in ("deploy/systemd/trainguard-agent.service",
                   "deploy/kubernetes/agent-daemonset.yaml",
                   "deploy/prometheus/prometheus.yml", "dashboards/README.md"):
        assert needed in named, (needed, named)
    assert "trainguard_sdk" in (ROOT / "README.md").read_text()  # the SDK lines it points to


@pytest.mark.parametrize("name", _named())
def test_every_named_file_exists_and_parses(name: str) -> None:
    path = ROOT / name
    assert path.exists(), f"README.md names {name}, which does not exist"
    if path.is_dir():
        return
    text = path.read_text()
    if path.suffix in (".yml", ".yaml"):
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
        assert docs and all(isinstance(d, dict) for d in docs), name
    elif path.suffix == ".json":
        json.loads(text)
    elif path.suffix == ".service":
        unit = parse_unit(text)
        for section, keys in UNIT_NEEDS.items():
            assert keys <= set(unit.get(section, {})), (name, section, keys)


def test_the_systemd_unit_runs_a_real_command() -> None:
    unit = parse_unit((ROOT / "deploy/systemd/trainguard-agent.service").read_text())
    (exec_start,) = unit["Service"]["ExecStart"]
    binary, *argv = shlex.split(exec_start)
    assert binary.startswith("/") and binary.endswith("/trainguard"), binary
    assert argv[0] == "agent"
    _parses(argv)
    env = dict(e.split("=", 1) for e in unit["Service"]["Environment"])
    assert env["TRAINGUARD_AGENT_SOCKET"].startswith("/run/trainguard/")
    assert unit["Service"]["RuntimeDirectory"] == ["trainguard"]  # the socket's directory


def test_the_unit_parser_refuses_a_broken_line() -> None:
    with pytest.raises(ValueError, match="line 2"):
        parse_unit("[Unit]\nDescription oops\n")
    with pytest.raises(ValueError, match="line 1"):
        parse_unit("ExecStart=/bin/true\n")


def _daemonset() -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    docs = list(yaml.safe_load_all((ROOT / "deploy/kubernetes/agent-daemonset.yaml").read_text()))
    by_kind = {d["kind"]: d for d in docs}
    return by_kind["DaemonSet"], by_kind


def test_the_daemonset_is_well_formed_and_runs_a_real_command() -> None:
    ds, by_kind = _daemonset()
    assert ds["apiVersion"] == "apps/v1"
    spec, pod = ds["spec"], ds["spec"]["template"]["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    assert pod["hostNetwork"] is True and pod["hostPID"] is True
    (agent,) = pod["containers"]
    assert agent["command"] == ["trainguard"] and agent["args"][0] == "agent"
    _parses(agent["args"])
    volumes = {v["name"] for v in pod["volumes"]}
    assert {m["name"] for m in agent["volumeMounts"]} <= volumes
    for ref in agent.get("envFrom", []):
        assert by_kind["ConfigMap"]["metadata"]["name"] == ref["configMapRef"]["name"]
    env = {**by_kind["ConfigMap"]["data"]}
    assert env["TRAINGUARD_AGENT_SOCKET"].startswith(
        next(m["mountPath"] for m in agent["volumeMounts"] if m["name"] == "run"))
    port = agent["args"][agent["args"].index("--metrics-port") + 1]
    assert [p["containerPort"] for p in agent["ports"]] == [int(port)]
    assert "$(NODE_NAME)" in agent["args"]
    assert any(e["name"] == "NODE_NAME" for e in agent["env"])


def _commands() -> list[list[str]]:
    out = []
    for block in re.findall(r"```bash\n(.*?)```", _section(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip()
            if line.startswith("trainguard "):
                out.append(shlex.split(line, comments=True)[1:])
    return out


def test_the_section_has_the_services_commands() -> None:
    heads = {" ".join(c[:2]) for c in _commands()}
    assert {"topics create", "streams --app-id", "incident serve", "alerts run",
            "metrics serve", "decide --command-key", "actuator --job-spec"} <= heads, heads


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a[:2]))
def test_every_command_in_the_section_parses(argv: list[str]) -> None:
    _parses(argv)


def _subcommand(argv: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser that ``argv`` ends up in: ``incident serve`` -> its own parser."""
    parser = build_parser()
    for word in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        parser = subs[0].choices[word]
    return parser


def key_flags(parser: argparse.ArgumentParser) -> list[str]:
    """The key files a subcommand loads (flags named --<signer>-<key word>), but those its
    help calls optional and hidden deprecated spellings."""
    return [a.option_strings[0] for a in parser._actions
            if a.option_strings and a.help not in (None, argparse.SUPPRESS)
            and any(w in KEY_WORDS for w in a.option_strings[0][2:].split("-"))
            and "optional" not in a.help]


def test_the_key_flags_are_read_from_the_parser() -> None:
    assert key_flags(_subcommand(["incident", "serve"])) == ["--command-pubkey",
                                                             "--actuator-pubkeys"]
    assert "--command-pubkey" not in key_flags(_subcommand(["decide"]))  # optional there
    assert key_flags(_subcommand(["topics", "create"])) == []


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a[:2]))
def test_every_command_passes_its_key_files(argv: list[str], tmp_path: Path) -> None:
    """Compose hands the keys over as TRAINGUARD_*_FILE variables; the README's commands,
    run as written, need them as flags: each naming a file `trainguard keys gen` makes."""
    made = {p.name for p in signing.generate(tmp_path).values()}
    for flag in key_flags(_subcommand(argv)):
        assert flag in argv, f"README: `trainguard {' '.join(argv[:2])}` lacks {flag}"
        value = Path(argv[argv.index(flag) + 1])
        assert value.name in made, (flag, value, made)


def _port(argv: list[str]) -> str:
    return argv[argv.index("--http-port") + 1]


def test_the_served_timelines_use_one_port() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    port = _port(compose["services"]["incidents"]["command"])
    (readme,) = [c for c in _commands() if c[:2] == ["incident", "serve"]]
    assert _port(readme) == port
    assert TIMELINE_DEFAULT.endswith(f":{port}")  # the dashboards' timeline variable
    for cfg in ("trainguard-alerts.yml", "trainguard-alerts.example.yml"):
        links = yaml.safe_load((ROOT / "deploy" / "alertmanager" / cfg).read_text())["links"]
        assert links["timeline_url"].endswith(f":{port}"), (cfg, links)
