"""The HTML timeline rendered by a real browser (Debian's chromium, headless): the DOM it
builds shows the six tracks and the four answers, and the screenshot shows the swimlanes
(their band colours and the marks' colours are on the rendered pixels)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from trainguard.incidents import rebuild_incidents
from trainguard.incidents.synth import incident_log
from trainguard.timeline import build_timeline, render
from trainguard.timeline.model import TRACK_TITLES, TRACKS
from trainguard.timeline.render_html import BANDS, COLOURS

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    if shutil.which(CHROMIUM) is None:
        pytest.fail(f"{CHROMIUM} is missing (the set-up installs Debian's chromium)")
    profile = tmp / f"profile-{len(list(tmp.iterdir()))}"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, timeout=90, check=True)


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Rows of RGB(A) pixels from an 8-bit non-interlaced PNG (what chromium writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    width = height = channels = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) \
                    & 255
        rows.append(bytes(line) if channels == 3 else
                    b"".join(bytes(line[i:i + 3]) for i in range(0, stride, 4)))
        prev = line
    return width, height, rows


def rgb(hex_colour: str) -> bytes:
    return bytes.fromhex(hex_colour.lstrip("#"))


def test_chromium_renders_the_tracks_and_the_four_answers(tmp_path: Path) -> None:
    log = incident_log()
    kill = list(rebuild_incidents(log)["job-a"].incidents.values())[1]
    timeline = build_timeline(kill, log)
    page = tmp_path / "incident.html"
    page.write_text(render(timeline, "html"))

    dom = chromium(tmp_path, "--dump-dom", page.as_uri()).stdout.decode()
    for track in TRACKS:
        assert f'data-track="{track}"' in dom
        assert TRACK_TITLES[track].replace("(", "").split()[0] in dom
    for answer in timeline.answers:
        assert f'data-question="{answer.key}"' in dom
        assert answer.question in dom
    assert "rank 3 pid 4103 exited (signal 9, seen via pidfd)" in dom
    assert "step 101, samples 3264" in dom and "continuous: no jump, no rerun" in dom

    shot = tmp_path / "incident.png"
    chromium(tmp_path, "--window-size=1300,1100", "--hide-scrollbars",
             f"--screenshot={shot}", page.as_uri())
    width, height, rows = png_pixels(shot.read_bytes())
    assert (width, height) == (1300, 1100)
    seen = {row[i:i + 3] for row in rows for i in range(0, len(row), 3)}
    for track in TRACKS:
        assert rgb(BANDS[track]) in seen, f"no {track} swimlane band on screen"
    for level in ("info", "bad", "good", "warn"):
        assert rgb(COLOURS[level]) in seen, f"no {level} mark on screen"
