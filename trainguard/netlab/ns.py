"""Network namespaces and a veth pair between two of them, always torn down."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from trainguard.netlab.procs import LineProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
PREFIX = "tgl-"  # every lab namespace: tgl-<creator pid>-<tag>-a|b


class LabError(RuntimeError):
    pass


def run(argv: Sequence[str], *, timeout_s: float = 10.0, check: bool = True,
        input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command, bounded; ``LabError`` with its stderr if ``check`` and it fails."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              input=input_text)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"{' '.join(argv)}: {exc}") from exc
    if check and done.returncode != 0:
        raise LabError(f"{' '.join(argv)}: rc={done.returncode}: {done.stderr.strip()}")
    return done


def require(*tools: str) -> None:
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        raise LabError(f"missing tools: {', '.join(missing)}")


def python_env() -> dict[str, str]:
    """Environment for a Python child that must import this checkout's ``trainguard``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Netns:
    """One named network namespace. ``exec_argv`` prefixes a command to run inside it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.procs: list[LineProcess] = []
        self.created = False

    def create(self) -> None:
        run(["ip", "netns", "add", self.name])
        self.created = True
        self.ip("link", "set", "lo", "up")

    def exec_argv(self, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *argv]

    def run(self, *argv: str, timeout_s: float = 10.0, check: bool = True,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
        return run(self.exec_argv(argv), timeout_s=timeout_s, check=check,
                   input_text=input_text)

    def ip(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run(["ip", "-n", self.name, *args], check=check)

    def spawn(self, argv: Sequence[str], *, stdin: bool = False) -> LineProcess:
        """Start a process inside; it is killed when the namespace is deleted."""
        p = LineProcess(self.exec_argv(argv), env=python_env(), cwd=REPO_ROOT, stdin=stdin)
        self.procs.append(p)
        return p

    def spawn_python(self, module: str, *args: str, stdin: bool = False) -> LineProcess:
        return self.spawn([sys.executable, "-m", module, *args], stdin=stdin)

    def delete(self) -> None:
        for p in self.procs:
            p.kill()
        self.procs.clear()
        if self.created:
            # Any process left inside (a child of ours that escaped its group) by pid.
            pids = run(["ip", "netns", "pids", self.name], check=False).stdout.split()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
                    os.kill(int(pid), 9)
            run(["ip", "netns", "del", self.name], check=False)
            self.created = False


class VethLab:
    """Namespaces ``a`` and ``b`` joined by veth ``dev_a`` <-> ``dev_b``, addressed
    ``addr_a``/``addr_b`` (a random 10.x /30 that exists only inside them). Use as a context
    manager; ``close`` is idempotent and never leaves the namespaces or the veth behind.

    ``gso_max_segs=1`` makes every skb one wire segment: otherwise veth carries GSO skbs of up to
    64 KiB unsegmented, and an nftables rule sees (and drops) one of those as one "packet"."""

    def __init__(self, tag: str | None = None, *, gso_max_segs: int | None = None) -> None:
        self.gso_max_segs = gso_max_segs
        require("ip")
        t = tag or uuid.uuid4().hex[:8]
        self.tag = t
        # The creator's pid is in the name, so a lab whose process died (SIGKILL, no teardown)
        # is recognised and swept by the next lab.
        self.a = Netns(f"{PREFIX}{os.getpid()}-{t}-a")
        self.b = Netns(f"{PREFIX}{os.getpid()}-{t}-b")
        self.dev_a, self.dev_b = f"tg{t[:8]}a", f"tg{t[:8]}b"  # <= 15 chars (IFNAMSIZ)
        x, y = random.randint(200, 250), random.randint(0, 255)
        z = random.randrange(0, 256, 4)
        self.addr_a, self.addr_b = f"10.{x}.{y}.{z + 1}", f"10.{x}.{y}.{z + 2}"
        self._veth_in_host = False

    def __enter__(self) -> VethLab:
        try:
            self.open()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def open(self) -> None:
        sweep_stale()
        self.a.create()
        self.b.create()
        # Created inside ns a from the start, so no end ever sits in the host namespace.
        self.a.ip("link", "add", self.dev_a, "type", "veth", "peer", "name", self.dev_b,
                  "netns", self.b.name)
        self.a.ip("addr", "add", f"{self.addr_a}/30", "dev", self.dev_a)
        self.b.ip("addr", "add", f"{self.addr_b}/30", "dev", self.dev_b)
        if self.gso_max_segs is not None:
            for ns, dev in ((self.a, self.dev_a), (self.b, self.dev_b)):
                ns.ip("link", "set", "dev", dev, "gso_max_segs", str(self.gso_max_segs))
        self.a.ip("link", "set", self.dev_a, "up")
        self.b.ip("link", "set", self.dev_b, "up")

    def close(self) -> None:
        self.a.delete()
        self.b.delete()


def leftovers(prefix: str = PREFIX) -> list[str]:
    """Namespaces with this lab's prefix that still exist."""
    out = run(["ip", "netns", "list"], check=False).stdout
    return [ln.split()[0] for ln in out.splitlines() if ln.startswith(prefix)]


def sweep_stale() -> list[str]:
    """Delete the labs' namespaces whose creating process is gone; their names."""
    swept: list[str] = []
    for name in leftovers():
        pid_s = name[len(PREFIX):].split("-", 1)[0]
        if not pid_s.isdigit() or _alive(int(pid_s)):
            continue
        ns = Netns(name)
        ns.created = True
        ns.delete()
        swept.append(name)
    return swept


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
