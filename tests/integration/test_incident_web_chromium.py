"""`trainguard incident serve --http-port` as a process against the real broker, its pages read
by a real browser (Debian's chromium, headless): the incident list and the kill incident's
timeline while the job is being mitigated, then, after the recovery is published, a reload of
the same pages shows it recovered. The pages come from the service's live fold, not a file."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests import keys
from tests.integration.conftest import arun
from tests.integration.test_incident_service import publish
from tests.integration.test_timeline_chromium import chromium
from trainguard.actuators.signing import sign_log
from trainguard.bus.config import KafkaConfig
from trainguard.incidents import rebuild_incidents
from trainguard.incidents.synth import incident_log

LOG = sign_log(incident_log(), keys.COMMAND, keys.ACTUATOR)
TIER1, KILL = list(rebuild_incidents(LOG)["job-a"].incidents.values())
assert KILL.closed_at is not None
BEFORE = [e for e in LOG if e.event_time < KILL.closed_at]  # migrated and resumed, not stepped
AFTER = [e for e in LOG if e.event_time >= KILL.closed_at]  # the resumed rank's first steps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def health(base: str) -> dict[str, object] | None:
    try:
        with urllib.request.urlopen(base + "/healthz", timeout=5) as resp:
            doc: dict[str, object] = json.loads(resp.read())
            return doc
    except OSError:
        return None


def wait_for(base: str, proc: subprocess.Popen[bytes], want: dict[str, object],
             limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    got = None
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        got = health(base)
        if got is not None and all(got.get(k) == v for k, v in want.items()):
            return
        time.sleep(0.3)
    raise AssertionError(f"/healthz never showed {want} (last: {got})")


def test_served_pages_in_chromium_follow_the_incident_live(kafka: KafkaConfig,
                                                           tmp_path: Path) -> None:
    arun(publish(kafka, BEFORE))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, **keys.env(), "TRAINGUARD_KAFKA_BOOTSTRAP": kafka.bootstrap,
           "TRAINGUARD_KAFKA_TOPIC_PREFIX": kafka.topic_prefix}
    proc = subprocess.Popen([sys.executable, "-m", "trainguard.cli.main", "incident", "serve",
                             "--idle-flush-s", "1", "--http-port", str(port)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    page = f"{base}/incidents/{KILL.incident_id}"
    try:
        wait_for(base, proc, {"incidents": 2, "open": 1})

        listing = chromium(tmp_path, "--dump-dom", base + "/").stdout.decode()
        assert f'data-incident="{KILL.incident_id}" data-state="mitigating"' in listing
        assert f'data-incident="{TIER1.incident_id}" data-state="recovered"' in listing
        assert f'href="incidents/{KILL.incident_id}"' in listing
        assert "process_exit" in listing and "node node-a, rank 3" in listing

        dom = chromium(tmp_path, "--dump-dom", page).stdout.decode()
        assert f"Incident {KILL.incident_id}" in dom
        assert '<span class="state" id="state">mitigating (tier 3)</span>' in dom
        assert "rank 3 pid 4103 exited (signal 9, seen via pidfd)" in dom  # the task topic
        assert "tier 2 migrate: done in 1.60 s" in dom  # commands and outcomes
        assert "RTT median" in dom  # the telemetry topic, read beside the fold
        assert "drill worker-exit on rank 3" in dom  # the drills topic
        assert "-&gt; recovered" not in dom

        arun(publish(kafka, AFTER))
        wait_for(base, proc, {"incidents": 2, "open": 0})

        dom = chromium(tmp_path, "--dump-dom", page).stdout.decode()  # a reload
        assert '<span class="state" id="state">recovered (tier 3)</span>' in dom
        assert "-&gt; recovered" in dom
        assert "step 101, samples 3264" in dom and "continuous: no jump, no rerun" in dom
        listing = chromium(tmp_path, "--dump-dom", base + "/").stdout.decode()
        assert f'data-incident="{KILL.incident_id}" data-state="recovered"' in listing
        assert "2 incident(s), 0 open" in listing

        missing = chromium(tmp_path, "--dump-dom", f"{base}/incidents/{'0' * 32}")
        assert "404: not found" in missing.stdout.decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert f"serving {base}/".encode() in out
    assert b"Traceback" not in err
