"""A real CPU quota through the machine's cgroup controller slows a real process."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid

import psutil

from trainguard.actuators.cgroups import create

BURN = "import time\nt = time.time()\nwhile time.time() - t < 60: pass\n"


def _cpu_rate(pid: int, seconds: float) -> float:
    proc = psutil.Process(pid)
    t0, w0 = proc.cpu_times(), time.monotonic()
    time.sleep(seconds)
    t1, w1 = proc.cpu_times(), time.monotonic()
    return ((t1.user - t0.user) + (t1.system - t0.system)) / (w1 - w0)


def test_a_quota_throttles_and_raising_it_releases() -> None:
    group = create(f"test-{uuid.uuid4().hex[:8]}")
    burner = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        group.add(burner.pid)
        assert burner.pid in group.pids()
        group.set_quota_pct(20)
        assert group.quota_pct() == 20
        throttled = _cpu_rate(burner.pid, 1.5)
        assert throttled < 0.35, throttled
        assert group.throttled_us() > 0
        group.set_quota_pct(None)
        assert group.quota_pct() is None
        free = _cpu_rate(burner.pid, 1.5)
        assert free > throttled * 1.8, (free, throttled)
    finally:
        burner.kill()
        burner.wait()
        group.remove()
    assert not group.path.exists()
