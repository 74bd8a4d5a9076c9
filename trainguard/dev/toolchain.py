"""Make sure Java 17+ and Maven are on the machine (Debian: install them with apt if missing)."""

from __future__ import annotations

import os
import shutil
import subprocess


class ToolchainError(RuntimeError):
    pass


def _apt_install(*packages: str) -> None:
    if shutil.which("apt-get") is None or os.geteuid() != 0:
        raise ToolchainError(
            f"{', '.join(packages)} missing and cannot be installed here (needs root and apt-get)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], check=True, env=env)


def java_major(java: str = "java") -> int | None:
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    for token in out.stderr.split():
        token = token.strip('"')
        if token[:1].isdigit():
            head = token.split(".")[0]
            return int(head) if head.isdigit() else None
    return None


def ensure_java_and_maven() -> None:
    major = java_major()
    if major is None or major < 17:
        _apt_install("openjdk-17-jre-headless")
    if shutil.which("mvn") is None:
        _apt_install("maven")
