"""docker-compose.yml as plain processes on this machine, derived from the file itself.

Docker does not run here, so this module reads docker-compose.yml (and the Dockerfile's
ENTRYPOINT) and starts what compose would start: each service's command, environment,
secrets, volumes, ports, and Kafka from its ``KAFKA_*`` settings. Only what cannot be the same
outside containers is translated, all of it in :class:`Translation` (the one mapping):

1. **addresses**: every (network namespace, port) the file names becomes ``127.0.0.1:<a free
   port>``. A service's namespace is its own name, or ``host`` with ``network_mode: host``; a
   published port ``[BIND:]H:C`` of service S makes (host, H) the same place as (S, C).
   Hostnames in values (``kafka:9092``, ``localhost:29092``, ``1@kafka:9093``,
   ``http://alertmanager:9093``) resolve from the service's own point of view: ``localhost``
   is its own namespace, a service name that service's, ``host.docker.internal`` the host.
   Bind-all addresses (``0.0.0.0``, an empty host) stay bind-all, on the mapped port; the
   ports named by ``--metrics-port`` / ``--http-port`` flags are mapped the same.
2. **paths**: each service's mounts: a named volume V -> ``<root>/volumes/V``; a host path
   /p -> ``<root>/host/p`` (unless it is under the root already: a variable the test set); a
   repository file bound into a container -> a copy with this same translation applied to its
   text (what the container reads, as it would read it); a secret N -> ``/run/secrets/N`` is
   its file (``TRAINGUARD_KEYS_DIR`` points at keys the compose ``keys`` set-up service made);
   the container's own writable layer -> ``TRAINGUARD_STATE=<root>/containers/S``.
3. **executables**: the image's ENTRYPOINT ``trainguard`` -> this interpreter's
   ``python -m trainguard.cli.main`` (the image's Python, trainguard installed). The job
   spec's ``python -m MODULE`` is left as it is: the actuator runs it with its own
   interpreter, as it would in the container.
4. **interpolation**: ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?msg}``,
   ``$$`` from the variables given (a fresh checkout: only ``TRAINGUARD_KEYS_DIR``).

Other images (Prometheus, Alertmanager) run from this machine's build of their program with
their compose command plus the settings their image implies (``Translation.image_argv``).
Kafka runs through ``trainguard.dev.kafka.KafkaBroker``: the compose ``KAFKA_*`` settings are
its properties (the apache/kafka image's naming: ``KAFKA_LOG_DIRS`` -> ``log.dirs``), over the
dev broker's generated ones for what compose leaves to the image's defaults.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trainguard.dev.kafka import free_port

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
TRAINGUARD_IMAGE = "trainguard:"
KAFKA_IMAGE = "apache/kafka:"
HOST = "host"  # the namespace of network_mode: host
SECRETS_DIR = "/run/secrets"
PORT_FLAGS = ("--metrics-port", "--http-port")
LOCAL_NAMES = ("localhost", "127.0.0.1")
BIND_ALL = ("", "0.0.0.0")

_VAR = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
                  r"|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)")
_ADDRESS = re.compile(r"(?<![\w.:-])(?P<host>[A-Za-z0-9][A-Za-z0-9_.-]*)?:(?P<port>\d{2,5})"
                      r"(?![\w.])")


class ComposeError(RuntimeError):
    pass


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable interpolation over every string of a parsed document."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("name") or m.group("bare")
        op, arg = m.group("op"), m.group("arg") or ""
        have = env.get(name)
        empty = have is None or (have == "" and op is not None and op.startswith(":"))
        if op in (":-", "-") and (have is None if op == "-" else empty):
            return arg
        if op in (":?", "?") and (have is None if op == "?" else empty):
            raise ComposeError(f"docker-compose.yml: ${{{name}}} is required: {arg}")
        return have or ""

    return _VAR.sub(one, value)


def load(env: Mapping[str, str]) -> dict[str, Any]:
    doc: dict[str, Any] = interpolate(yaml.safe_load(COMPOSE.read_text()), env)
    return doc


def entrypoint() -> list[str]:
    """The image's ENTRYPOINT, from the Dockerfile (exec form)."""
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("ENTRYPOINT"):
            value: list[str] = json.loads(line.removeprefix("ENTRYPOINT").strip())
            return value
    raise ComposeError("Dockerfile: no ENTRYPOINT")


def kafka_properties(environment: Mapping[str, Any]) -> dict[str, str]:
    """The apache/kafka image's mapping of ``KAFKA_*`` variables to server properties."""
    out = {}
    for name, value in environment.items():
        if not name.startswith("KAFKA_"):
            continue
        key = name.removeprefix("KAFKA_").lower()
        key = key.replace("___", "-").replace("__", "\0").replace("_", ".").replace("\0", "_")
        out[key] = str(value)
    return out


def as_env(environment: Any) -> dict[str, str]:
    if isinstance(environment, list):
        return dict(item.split("=", 1) for item in environment)
    return {k: "" if v is None else str(v) for k, v in (environment or {}).items()}


@dataclass
class Translation:
    """THE mapping from compose's world to this machine (the module doc lists it)."""

    doc: dict[str, Any]
    root: Path
    ports: dict[tuple[str, int], int] = field(default_factory=dict)
    python: str = sys.executable

    def __post_init__(self) -> None:
        for name, svc in self.services().items():
            for spec in svc.get("ports", []):
                parts = str(spec).split(":")
                if len(parts) < 2:
                    continue
                local = self.port(self.namespace(name), int(parts[-1]))
                self.ports[(HOST, int(parts[-2]))] = local

    def services(self) -> dict[str, dict[str, Any]]:
        services: dict[str, dict[str, Any]] = self.doc["services"]
        return services

    def namespace(self, service: str) -> str:
        mode = self.services()[service].get("network_mode")
        return HOST if mode == "host" else service

    def port(self, namespace: str, port: int) -> int:
        if (namespace, port) not in self.ports:
            self.ports[(namespace, port)] = free_port()
        return self.ports[(namespace, port)]

    def resolve(self, service: str, host: str) -> str | None:
        """The namespace a hostname names, seen from ``service``; None if not compose's."""
        if host in LOCAL_NAMES or host in BIND_ALL:
            return self.namespace(service)
        if host == "host.docker.internal":
            return HOST
        if host in self.services():
            return self.namespace(host)
        return None

    def address(self, service: str, text: str) -> str:
        def one(m: re.Match[str]) -> str:
            host = m.group("host") or ""
            ns = self.resolve(service, host)
            if ns is None:
                return m.group(0)
            shown = host if host in BIND_ALL else "127.0.0.1"
            return f"{shown}:{self.port(ns, int(m.group('port')))}"

        return _ADDRESS.sub(one, text)

    # --- paths --------------------------------------------------------------------------

    def mounts(self, service: str) -> dict[str, Path]:
        """Container path -> local path, for this service's volumes and secrets."""
        svc = self.services()[service]
        out: dict[str, Path] = {}
        for spec in svc.get("volumes", []):
            source, target = str(spec).split(":")[:2]
            if source.startswith((".", "/")) and (ROOT / source).is_file():
                out[target] = self.bound_file(service, ROOT / source, target)
            elif source.startswith("/"):
                out[target] = self.host_path(source)
            elif source.startswith("."):
                out[target] = (ROOT / source).resolve()
            else:
                out[target] = self.root / "volumes" / source
        declared = self.doc.get("secrets", {})
        for secret in svc.get("secrets", []):
            name = secret if isinstance(secret, str) else secret["source"]
            target = f"{SECRETS_DIR}/{name}"
            out[target] = (ROOT / declared[name]["file"]).resolve()
        return out

    def host_path(self, source: str) -> Path:
        """A host path: under ``<root>/host`` unless it is one of ours already (a variable
        such as TRAINGUARD_KEYS_DIR set to a directory under the root)."""
        path = Path(source)
        return path if path.is_relative_to(self.root) else self.root / "host" / source.lstrip("/")

    def bound_file(self, service: str, source: Path, target: str) -> Path:
        copy = self.root / "binds" / service / target.lstrip("/")
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(self.text(service, source.read_text(), files=False))
        return copy

    def path(self, service: str, text: str, mounts: Mapping[str, Path]) -> str:
        for target in sorted(mounts, key=len, reverse=True):
            if text == target or text.startswith(target.rstrip("/") + "/"):
                return str(mounts[target]) + text[len(target):]
        return text

    def text(self, service: str, text: str, files: bool = True) -> str:
        """A file's text as the container would read it: its paths and addresses here."""
        mounts = self.mounts(service) if files else self._dir_mounts(service)
        out = re.sub(r"(?<![\w.])/[\w./{}-]+",
                     lambda m: self.path(service, m.group(0), mounts), text)
        return self.address(service, out)

    def _dir_mounts(self, service: str) -> dict[str, Path]:
        svc = self.services()[service]
        out: dict[str, Path] = {}
        for spec in svc.get("volumes", []):
            source, target = str(spec).split(":")[:2]
            if source.startswith("/"):
                out[target] = self.host_path(source)
            elif source.startswith("."):
                if (ROOT / source).is_dir():
                    out[target] = (ROOT / source).resolve()
            else:
                out[target] = self.root / "volumes" / source
        return out

    # --- a service as a process ---------------------------------------------------------

    def argv(self, service: str) -> list[str]:
        svc = self.services()[service]
        command = [str(c) for c in svc.get("command", [])]
        entry = [str(c) for c in svc.get("entrypoint", entrypoint())]
        if entry != ["trainguard"]:
            raise ComposeError(f"{service}: entrypoint {entry} is not the image's trainguard")
        mounts = self.mounts(service)
        out = [self.python, "-m", "trainguard.cli.main"]
        previous = ""
        for arg in command:
            if previous in PORT_FLAGS and arg.isdigit() and int(arg):
                arg = str(self.port(self.namespace(service), int(arg)))
            out.append(self.address(service, self.path(service, arg, mounts)))
            previous = arg
        return out

    def image_argv(self, service: str, binary: str,
                   defaults: Mapping[str, str]) -> list[str]:
        """A service of another image, run from this machine's build of its program: its
        compose command, plus the image's implicit settings (``defaults``: what its Dockerfile
        sets and compose does not override), translated alike; a path the container does not
        mount lies in its writable layer, ``<root>/containers/S``."""
        svc = self.services()[service]
        command = [str(c) for c in svc.get("command", [])]
        given = {arg.split("=", 1)[0] for arg in command}
        mounts = self.mounts(service)
        layer = self.root / "containers" / service

        def value(text: str) -> str:
            local = self.path(service, text, mounts)
            if local == text and text.startswith("/"):
                local = str(layer / text.lstrip("/"))
            return self.address(service, local)

        out = [binary]
        for arg in [*command, *(f"{k}={v}" for k, v in defaults.items() if k not in given)]:
            flag, eq, val = arg.partition("=")
            out.append(f"{flag}={value(val)}" if eq else arg)
        layer.mkdir(parents=True, exist_ok=True)
        return out

    def env(self, service: str) -> dict[str, str]:
        mounts = self.mounts(service)
        env = {k: self.address(service, self.path(service, v, mounts))
               for k, v in as_env(self.services()[service].get("environment")).items()}
        env["TRAINGUARD_STATE"] = str(self.root / "containers" / service)
        for target, local in mounts.items():
            if not target.startswith(SECRETS_DIR) and not local.suffix:
                local.mkdir(parents=True, exist_ok=True)
        return env

    def kafka(self, service: str) -> dict[str, str]:
        mounts = self.mounts(service)
        props = kafka_properties(as_env(self.services()[service].get("environment")))
        return {k: self.address(service, self.path(service, v, mounts))
                for k, v in props.items()}

    def start_order(self) -> Iterator[str]:
        """Services in depends_on order (compose's start order)."""
        done: list[str] = []
        services = self.services()

        def visit(name: str, seen: tuple[str, ...]) -> None:
            if name in done:
                return
            if name in seen:
                raise ComposeError(f"depends_on cycle through {name}")
            deps = services[name].get("depends_on", [])
            for dep in (deps if isinstance(deps, list) else list(deps)):
                visit(dep, (*seen, name))
            done.append(name)

        for name in services:
            visit(name, ())
        yield from done

    def cleanup(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.root.parent.rmdir()  # when no other run's root is left in it


def image(svc: Mapping[str, Any]) -> str:
    return str(svc.get("image", ""))


def condition(svc: Mapping[str, Any], dep: str) -> str:
    deps = svc.get("depends_on", {})
    if isinstance(deps, list):
        return "service_started"
    return str((deps.get(dep) or {}).get("condition", "service_started"))
